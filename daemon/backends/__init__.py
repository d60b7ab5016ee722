"""Backends behind one small contract (:mod:`inferd.backends.base`) that the cold runtime drives."""
