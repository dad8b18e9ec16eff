"""The torch Dataset over a packed split: a memory-mapped file of token ids, one block per item."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset


class PackedDataset(Dataset):
    """Blocks of block_size+1 tokens stored back to back in a flat binary file.

    Item i is `{"input_ids": block[:-1], "labels": block[1:]}` (each a LongTensor of block_size): the
    labels are the inputs shifted by one, so a model's loss needs no further shifting. The file is
    opened lazily and the memory map is not pickled, so DataLoader workers each map it themselves
    instead of receiving a copy of the data.
    """

    def __init__(self, path: Path, block_size: int, num_blocks: int, dtype: str) -> None:
        self.path = Path(path)
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.dtype = np.dtype(dtype)
        self._tokens: np.memmap | None = None

    def __len__(self) -> int:
        return self.num_blocks

    def _mapped(self) -> np.memmap:
        if self._tokens is None:
            self._tokens = np.memmap(self.path, dtype=self.dtype, mode="r")
        return self._tokens

    def block(self, index: int) -> np.ndarray:
        """The raw block of block_size+1 token ids (a view into the memory map)."""
        if index < 0:
            index += self.num_blocks
        if not 0 <= index < self.num_blocks:
            raise IndexError(f"block {index} out of range for {self.num_blocks} blocks")
        n = self.block_size + 1
        return self._mapped()[index * n : (index + 1) * n]

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        tokens = torch.from_numpy(self.block(index).astype(np.int64))  # (block_size + 1,)
        return {"input_ids": tokens[:-1], "labels": tokens[1:]}

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_tokens"] = None  # pickling a memmap would copy the whole split
        return state
