"""Processing declared once and stored with the model: image, text and audio pre-processing,
post-processing of outputs into answers (see ``processing.py``)."""

from modelpress.runtime.processing.processing import (
    METADATA_KEY,
    PRE_KINDS,
    Processing,
    parse_post,
    parse_pre,
    read_spec,
)

__all__ = ["METADATA_KEY", "PRE_KINDS", "Processing", "parse_post", "parse_pre", "read_spec"]
