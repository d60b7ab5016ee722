"""The inferd daemon: model repository, per-model queues and workers, ZeroMQ serving, systemd glue.

Entry point: :func:`serve_main` (``inferd serve``; also ``python -m inferd.server``).
"""
from .daemon import EndpointBusy, Server, serve_main

__all__ = ["EndpointBusy", "Server", "serve_main"]
