"""The host NumPy/BLAS backend's registration: importing this module registers it.

One job: import the piece that registers itself (the unit kind ``"blas"``,
:class:`codegen.backends.numpy_host.units.ContractionUnit`, whose import also
registers the GEMM plans' runner) and name this backend's retired module
constants (:data:`RETIRED`, for :mod:`codegen._retired`).
:mod:`codegen.backends.registered` finds this module by its name, as it finds
every backend's.
"""

from . import units as _units  # noqa: F401 - registers

__all__ = ["RETIRED"]

#: module (under this package) -> {retired constant: the codegen Options field now}
RETIRED = {
    "gemm": {
        "GEMM_THREADS": "gemm_threads", "GEMM_SPLIT_MIN": "gemm_split_min",
        "LOAD_CHECK_S": "gemm_load_check_s", "RUN_COST": "gemm_run_cost",
        "CHUNK_MIN_BYTES": "gemm_chunk_min_bytes", "CHUNK_BYTES": "gemm_chunk_bytes"},
    "parking": {"ENABLED": "park_blas"},
}
