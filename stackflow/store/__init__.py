"""COSI-style record store: versioned, owned records with phases and finalizers."""

from stackflow.store.base import Metadata, Record, RecordPhase, RecordStore
from stackflow.store.filesystem import FileRecordStore
from stackflow.store.memory import MemoryRecordStore

__all__ = [
    "FileRecordStore",
    "MemoryRecordStore",
    "Metadata",
    "Record",
    "RecordPhase",
    "RecordStore",
]
