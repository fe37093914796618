"""`models.gguf_parsed_once`: the GGUF reader a conversion uses parses what gguf's own reader
parses, once per file, and leaves gguf as it found it."""

from __future__ import annotations

import gguf
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from bbox_sae.models import gguf_parsed_once

texts = st.text(st.characters(exclude_categories=("Cs",)), max_size=12)
metadata = st.dictionaries(
    st.from_regex(r"[a-z]{1,8}\.[a-z_]{1,8}", fullmatch=True),
    st.one_of(
        texts,
        st.integers(0, 2**32 - 1),
        st.floats(width=32, allow_nan=False),
        st.lists(texts, min_size=1, max_size=40),
        st.lists(st.integers(-(2**31), 2**31 - 1), min_size=1, max_size=40),
    ),
    max_size=6,
)
tensors = st.lists(st.tuples(st.integers(1, 5), st.integers(1, 7)), min_size=1, max_size=3)


def write_gguf(path, fields: dict, shapes: list[tuple[int, int]]) -> None:
    writer = gguf.GGUFWriter(str(path), arch="llama")
    for key, value in fields.items():
        if isinstance(value, str):
            writer.add_string(key, value)
        elif isinstance(value, float):
            writer.add_float32(key, value)
        elif isinstance(value, int):
            writer.add_uint32(key, value)
        else:
            writer.add_array(key, value)
    for i, shape in enumerate(shapes):
        writer.add_tensor(f"blk.{i}.weight", np.arange(np.prod(shape), dtype=np.float32).reshape(shape) / 7)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def parsed(reader) -> tuple:
    fields = [(f.name, f.offset, list(f.types), list(f.data), [bytes(p) for p in f.parts]) for f in reader.fields.values()]
    found = [(t.name, t.tensor_type, list(t.shape), t.n_elements, t.data_offset, bytes(t.data)) for t in reader.tensors]
    return fields, found


@settings(max_examples=25, deadline=None)
@given(fields=metadata, shapes=tensors)
def test_the_conversions_reader_parses_what_ggufs_own_reader_parses(tmp_path_factory, fields, shapes):
    path = tmp_path_factory.mktemp("gguf") / "m.gguf"
    write_gguf(path, fields, shapes)
    expected = parsed(gguf.GGUFReader(path))
    with gguf_parsed_once():
        assert parsed(gguf.GGUFReader(path)) == expected


def test_each_file_is_parsed_once_into_plain_arrays_and_gguf_is_restored(tmp_path):
    original = gguf.GGUFReader
    paths = [tmp_path / "a.gguf", tmp_path / "b.gguf"]
    for path in paths:
        write_gguf(path, {"general.name": path.stem}, [(2, 3)])
    with gguf_parsed_once():
        first, again, other = gguf.GGUFReader(paths[0]), gguf.GGUFReader(paths[0]), gguf.GGUFReader(paths[1])
        assert first is again and other is not first
        assert type(first.data) is np.ndarray and type(first.tensors[0].data) is np.ndarray
        assert bytes(other.fields["general.name"].parts[-1]) == b"b"
    assert gguf.GGUFReader is original
    assert type(gguf.GGUFReader(paths[0]).data) is np.memmap
