"""Operator families. Importing this package registers every op and CPU kernel (explicit list)."""
from . import base  # noqa: F401
from . import activation  # noqa: F401
from . import elementwise  # noqa: F401
from . import tensor  # noqa: F401
from . import reduce  # noqa: F401
from . import conv  # noqa: F401
from . import conv_implicit  # noqa: F401
from . import conv_nchwc  # noqa: F401
from . import gemm  # noqa: F401
from . import pool  # noqa: F401
from . import norm  # noqa: F401
from . import resize  # noqa: F401
from . import recurrent  # noqa: F401
from . import control  # noqa: F401
from . import indexing  # noqa: F401
from . import layout  # noqa: F401
from . import datadep  # noqa: F401
from . import detection  # noqa: F401
from . import signal  # noqa: F401
from . import sampling  # noqa: F401
from . import misc  # noqa: F401
from . import attention  # noqa: F401
from . import quant  # noqa: F401
from . import quant_native  # noqa: F401
from .base import (Kernel, Layer, OpSpec, applicable_kernels, choose_kernel, kernels_for, op_spec,  # noqa: F401
                   raw_key, registered_ops, run_layer, single_node_layer)
