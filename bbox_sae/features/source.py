"""The rows as the stages after training read them, opened once per command.

Features, label and evaluation all need the built matrix by split, each row's word and its rule
attributes, and the latent encoder of a feature source (`sae`, or a baseline). Each used to open
the matrix, join the words and build the encoder again; for the k-means baseline that refitted
the clustering, and the label stage re-encoded every row. `feature_source` builds a
`FeatureSource` once and hands the same object to every caller in the process while the files it
was built from are unchanged (checked by inode, size and mtime, which an atomic rewrite changes).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np
import pyarrow as pa

from bbox_sae.build.matrix import open_matrix
from bbox_sae.config import Config
from bbox_sae.features.activations import Firing, firing
from bbox_sae.features.contexts import word_attributes_by_position, words_by_row
from bbox_sae.features.encoders import Encoder, make_encoder
from bbox_sae.features.rules import WordAttributes


@dataclass(frozen=True)
class Matrix:
    """The built matrix with its row index, and its rows by split."""

    values: np.ndarray
    index: pa.Table
    info: dict
    rows_by_split: dict[str, np.ndarray]

    @property
    def models(self) -> list[str]:
        return self.info["models"]


def open_rows(cfg: Config) -> Matrix:
    matrix, index, info = open_matrix(cfg)
    split = index["split"].to_numpy(zero_copy_only=False)
    rows = index["row"].to_numpy()
    return Matrix(matrix, index, info, {"train": rows[split == "train"], "holdout": rows[split == "holdout"]})


@dataclass(frozen=True)
class FeatureSource:
    """One feature source over one built matrix. Everything is opened or built on first use: a
    caller that only needs words never loads the SAE."""

    cfg: Config
    name: str  # `sae`, `random` or `kmeans`

    @cached_property
    def matrix(self) -> Matrix:
        return open_rows(self.cfg)

    @cached_property
    def _words(self) -> tuple[np.ndarray, np.ndarray]:
        return words_by_row(self.cfg, self.matrix.index)

    @property
    def words_of_row(self) -> np.ndarray:
        """The word string of every matrix row (object array)."""
        return self._words[0]

    @cached_property
    def attrs(self) -> WordAttributes:
        """Rule attributes of every matrix row's word, in row order."""
        return word_attributes_by_position(self.cfg).take(self._words[1])

    @cached_property
    def _encoder(self) -> tuple[Encoder, int]:
        m = self.matrix
        return make_encoder(self.cfg, self.name, m.values, m.rows_by_split["train"], m.info)

    @property
    def encode(self) -> Encoder:
        return self._encoder[0]

    @property
    def d_sae(self) -> int:
        return self._encoder[1]

    def fires(self, latents: list[int]) -> Firing:
        """Whether each latent fires on every row (rows × latents, bool, stored sparse)."""
        return firing(self.encode, self.matrix.values, latents, self.cfg.features.chunk_rows)


def _identity(paths: list[Path]) -> tuple:
    out = []
    for path in paths:
        files = sorted(p for p in path.iterdir() if p.is_file()) if path.is_dir() else [path]
        for f in files:
            try:
                st = os.stat(f)
            except FileNotFoundError:
                out.append((str(f), None))
                continue
            out.append((str(f), st.st_ino, st.st_size, st.st_mtime_ns))
    return tuple(out)


_opened: dict[tuple, FeatureSource] = {}


def feature_source(cfg: Config, name: str = "sae") -> FeatureSource:
    """The `FeatureSource` of `name` for this run, reused while its inputs are the same files."""
    paths = cfg.paths
    inputs = [paths.matrix, paths.index, paths.build_info, paths.words]
    if name == "sae":
        inputs.append(cfg.sae_paths.root)
    key = (str(paths.root.resolve()), name, cfg.model_dump_json(), _identity(inputs))
    if key not in _opened:
        # One source at a time: a command works on one run, and each holds a memory map and an encoder.
        _opened.clear()
        _opened[key] = FeatureSource(cfg, name)
    return _opened[key]
