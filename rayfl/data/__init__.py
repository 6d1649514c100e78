"""Datasets, partitioners and the memory-mapped partition store."""

from rayfl.data.config import DataConfig
from rayfl.data.store import DataHandle, DataReader, prepare

__all__ = ["DataConfig", "DataHandle", "DataReader", "prepare"]
