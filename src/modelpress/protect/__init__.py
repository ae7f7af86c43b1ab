"""Model protection: encryption (the ``.mpk`` package) and obfuscation that still runs, with the
protection measured. See docs/protect.md.

    from modelpress.protect import keygen, load_key, protect, open_package, is_package
"""

from modelpress.protect.api import (
    DEFAULT_RATIO,
    ProtectResult,
    is_package,
    open_package,
    protect,
    unlock,
)
from modelpress.protect.keys import keygen, load_key
from modelpress.protect.library import is_obfuscated
from modelpress.protect.metrics import ProtectionMetrics
from modelpress.protect.package import PackageError

__all__ = [
    "DEFAULT_RATIO",
    "PackageError",
    "ProtectResult",
    "ProtectionMetrics",
    "is_obfuscated",
    "is_package",
    "keygen",
    "load_key",
    "open_package",
    "protect",
    "unlock",
]
