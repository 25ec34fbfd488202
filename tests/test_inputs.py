"""anekit.inputs: regular files only, sizes checked before reading, .npy headers checked before loading."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import numpy as np
import pytest

from anekit.errors import AnekitError
from anekit.inputs import (
    SHOWN,
    InputError,
    check_input,
    kind_of,
    load_npy,
    read_bytes,
    read_text,
    shown,
    stat_input,
)
from tests.fuzz_util import watchdog


def test_a_regular_file_is_read(tmp_path: Path) -> None:
    (tmp_path / "a.mil").write_text("héllo")
    assert read_text(tmp_path / "a.mil", "[t] cannot read", 100) == "héllo"
    assert read_bytes(tmp_path / "a.mil", "[t] cannot read", 6) == "héllo".encode()
    assert check_input(tmp_path / "a.mil", "[t]").st_size == 6


def test_a_fifo_is_refused_without_being_opened(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "p")
    with (
        watchdog(10),
        pytest.raises(InputError, match=r"^\[t\] cannot read .*/p: a FIFO \(named pipe\), not x$"),
    ):
        read_text(tmp_path / "p", "[t] cannot read", 100, "x")


@pytest.mark.parametrize(
    ("path", "kind"), [("/dev/zero", "a character device"), ("/dev/null", "a character device")]
)
def test_a_device_is_refused_before_any_read(path: str, kind: str) -> None:
    with watchdog(10), pytest.raises(InputError, match=kind):
        read_bytes(path, "[t] cannot read", 1 << 30)


def test_a_directory_and_a_socket_say_what_they_are(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="a directory, not a regular file"):
        check_input(tmp_path, "[t]")
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(tmp_path / "s"))
        with pytest.raises(InputError, match="a socket"):
            check_input(tmp_path / "s", "[t]")
    assert kind_of(os.stat(tmp_path).st_mode) == "a directory"


def test_a_file_over_the_limit_is_refused_before_it_is_read(tmp_path: Path) -> None:
    (tmp_path / "big").write_bytes(b"x" * 101)
    with pytest.raises(InputError, match="101 bytes, over the 100-byte limit"):
        read_bytes(tmp_path / "big", "[t]", 100)


def test_not_utf8_says_where(tmp_path: Path) -> None:
    (tmp_path / "b").write_bytes(b"ab\xff")
    with pytest.raises(InputError, match="not UTF-8 text \\(byte 0xff at offset 2\\)"):
        read_text(tmp_path / "b", "[t]", 100)


def test_a_long_path_is_one_line_with_the_path_shortened(tmp_path: Path) -> None:
    long = tmp_path / ("a" * 300)
    with pytest.raises(InputError) as e:
        check_input(long, "[t] cannot read")
    line = e.value.one_line()
    assert line.endswith(f"({len(str(long))} characters): file name too long")
    assert len(line) < SHOWN + 100 and isinstance(e.value, AnekitError)
    assert shown("short") == "short"
    assert stat_input(tmp_path / "nope", "[t]") is None


@pytest.mark.parametrize(
    "array",
    [
        np.arange(12, dtype=np.float32).reshape(3, 4),
        np.arange(12, dtype=np.float16).reshape(3, 4),
        np.asfortranarray(np.arange(12, dtype=np.float64).reshape(3, 4)),
        np.arange(6, dtype=">f4"),
    ],
)
def test_a_float_npy_loads_as_numpy_loads_it(array: np.ndarray, tmp_path: Path) -> None:
    np.save(tmp_path / "a.npy", array)
    got = load_npy(tmp_path / "a.npy", "[t]")
    assert got.dtype == array.dtype and got.shape == array.shape and np.array_equal(got, array)
    assert got.flags.writeable


@pytest.mark.parametrize(
    ("array", "says"),
    [
        (np.ones(3, np.complex64), "complex numbers"),
        (np.array(["a", "b"]), "strings"),
        (np.zeros((2, 0), np.float32), "is empty"),
        (np.ones(3, np.int64), "int64 values"),
        (np.ones(3, np.int8), "int8 values"),
        (np.ones(3, bool), "bool values"),
        (np.zeros(3, [("a", "<f4")]), "structured array"),
        (np.array([np.datetime64("2020-01-01")]), "datetime64"),
    ],
)
def test_an_npy_that_is_not_real_numbers_is_refused(array: np.ndarray, says: str, tmp_path: Path) -> None:
    np.save(tmp_path / "a.npy", array)
    with pytest.raises(InputError, match=says):
        load_npy(tmp_path / "a.npy", "[t]")


def test_an_npy_header_is_checked_before_any_allocation(tmp_path: Path) -> None:
    for shape in [(10**12,), (2**70,), (2**40, 2**40)]:
        with open(tmp_path / "h.npy", "wb") as f:
            np.lib.format.write_array_header_2_0(f, {"descr": "<f4", "fortran_order": False, "shape": shape})
            f.write(b"\0" * 16)
        with pytest.raises(InputError, match="but the file holds 16 bytes"):
            load_npy(tmp_path / "h.npy", "[t]")
        with pytest.raises(InputError, match="expected \\[4\\]"):
            load_npy(tmp_path / "h.npy", "[t]", expect=(4,))


def test_an_npy_with_a_bad_magic_or_a_pickle_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "g.npy").write_bytes(b"not numpy at all")
    with pytest.raises(InputError, match=r"not a \.npy array"):
        load_npy(tmp_path / "g.npy", "[t]")
    np.save(tmp_path / "o.npy", np.array([{}], dtype=object), allow_pickle=True)
    with pytest.raises(InputError, match="allow_pickle"):
        load_npy(tmp_path / "o.npy", "[t]")


def test_an_integer_input_takes_integers_in_its_range_only(tmp_path: Path) -> None:
    np.save(tmp_path / "t.npy", np.array([1, 2, 300], np.int64))
    got = load_npy(tmp_path / "t.npy", "[t]", kind="int", int_range=(-(2**31), 2**31 - 1))
    assert got.tolist() == [1, 2, 300]
    with pytest.raises(InputError, match=r"holds 1 \.\. 300, outside the input's -128 \.\. 127"):
        load_npy(tmp_path / "t.npy", "[t]", kind="int", int_range=(-128, 127))
    np.save(tmp_path / "f.npy", np.ones(3, np.float32))
    with pytest.raises(InputError, match="float32 values for an integer input"):
        load_npy(tmp_path / "f.npy", "[t]", kind="int")
    with pytest.raises(InputError, match="float32 values for a bool input"):
        load_npy(tmp_path / "f.npy", "[t]", kind="bool")
