"""User data sources (issue 24): a node's own files instead of a built-in data set.

Flow: :func:`read_source` reads what is at a path (image folder, CSV or Parquet table, npz
arrays, Hugging Face dataset) without encoding it; :func:`profile` describes it in a small
JSON-able dict (no rows) a node may send; :func:`merge` makes one :class:`DataSchema` out of
every node's profile; :func:`encode` turns a node's rows into a :class:`headway.core.data.Dataset`
the same way at every node. Class labels agree by name, tabular scaling uses moments summed
over the nodes, and column order is the schema's, never a file's.

One module a stage: :mod:`~headway.core.sources.options` (how a source is read, a node's reader
limits), :mod:`~headway.core.sources.reading`, :mod:`~headway.core.sources.profiling`,
:mod:`~headway.core.sources.schema`, :mod:`~headway.core.sources.encoding`, :mod:`~headway.core.sources.writing`
(``headway split``), and :mod:`~headway.core.sources.common` (what they share). The names below are
the package's interface: import them from ``headway.core.sources``.
"""

from __future__ import annotations

from headway.core.sources.common import SourceError, sort_classes
from headway.core.sources.encoding import encode, load_user_source
from headway.core.sources.options import (
    DEFAULT_MAX_ARRAY_BYTES,
    DEFAULT_MAX_IMAGE_PIXELS,
    MAX_IMAGE_SIZE,
    NODE_LIMIT_KEYS,
    ReaderLimits,
    SourceOptions,
    is_path_source,
    limits_from_node_config,
    options_from_config,
)
from headway.core.sources.profiling import profile, profile_problem
from headway.core.sources.reading import RawSource, RawSplit, _hold_out, read_source
from headway.core.sources.schema import STD_EPS, DataSchema, fits, merge
from headway.core.sources.writing import write_csv, write_image_folder, write_npz

__all__ = [
    "DEFAULT_MAX_ARRAY_BYTES",
    "DEFAULT_MAX_IMAGE_PIXELS",
    "MAX_IMAGE_SIZE",
    "NODE_LIMIT_KEYS",
    "STD_EPS",
    "DataSchema",
    "RawSource",
    "RawSplit",
    "ReaderLimits",
    "SourceError",
    "SourceOptions",
    "_hold_out",
    "encode",
    "fits",
    "is_path_source",
    "limits_from_node_config",
    "load_user_source",
    "merge",
    "options_from_config",
    "profile",
    "profile_problem",
    "read_source",
    "sort_classes",
    "write_csv",
    "write_image_folder",
    "write_npz",
]
