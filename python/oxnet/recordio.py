"""RecordIO files (MXNet's ``mxnet.recordio``): sequential and indexed record files, and the
image record header.

The framing is dmlc-core's, so ``.rec``/``.idx`` files are exchanged with MXNet byte for byte.
Each record is written as one or more parts; a part is

    magic (uint32 0xced7230a) | lrec (uint32: cflag << 29 | length) | length bytes | zero padding to 4 bytes

All words are little-endian (MXNet writes its machine's order; every platform it ships for is
little-endian). A payload that contains the magic word at a 4-byte-aligned position is split
there, so that the magic only ever appears in a file as a part header and a reader can find
record starts by scanning aligned words: cflag 0 is a whole record, 1 its first part, 2 a middle
part and 3 the last part; the magic itself is dropped at each split and restored on reading.

An index file (``.idx``) has one line ``key<TAB>byte offset`` per record.
"""

import io as _io
import numbers
import os
import struct
from collections import namedtuple
from multiprocessing import current_process

import numpy as np

from .base import MXNetError

__all__ = ["MXRecordIO", "MXIndexedRecordIO", "IRHeader", "pack", "unpack", "pack_img", "unpack_img"]

_MAGIC = 0xCED7230A
_MAGIC_BYTES = struct.pack("<I", _MAGIC)
_PART_HEADER = struct.Struct("<II")
_LENGTH_BITS = 29
_MAX_RECORD_BYTES = 1 << _LENGTH_BITS
_LENGTH_MASK = _MAX_RECORD_BYTES - 1
_WHOLE, _FIRST, _MIDDLE, _LAST = 0, 1, 2, 3


def _padding(length):
    return -length % 4


def _record_parts(payload):
    """(cflag, bytes) of each part ``payload`` is written as."""
    parts = []
    start = 0
    found = payload.find(_MAGIC_BYTES)
    while found != -1:
        if found % 4 == 0:
            parts.append((_FIRST if start == 0 else _MIDDLE, payload[start:found]))
            start = found + 4
            found = payload.find(_MAGIC_BYTES, start)
        else:
            found = payload.find(_MAGIC_BYTES, found + 1)
    parts.append((_LAST if start != 0 else _WHOLE, payload[start:]))
    return parts


def encode_record(payload):
    """The bytes one record takes in a ``.rec`` file."""
    payload = bytes(payload)
    if len(payload) >= _MAX_RECORD_BYTES:
        raise MXNetError("RecordIO only accepts records of less than 2^29 bytes, got %d bytes" % len(payload))
    chunks = []
    for cflag, part in _record_parts(payload):
        chunks.append(_PART_HEADER.pack(_MAGIC, (cflag << _LENGTH_BITS) | len(part)))
        chunks.append(part)
        chunks.append(b"\0" * _padding(len(part)))
    return b"".join(chunks)


def read_record_at(read, where):
    """The payload of the record whose parts ``read(n)`` returns, or None at a clean end of file.

    ``where`` names the file and position in errors."""
    payload = []
    first = True
    while True:
        header = read(_PART_HEADER.size)
        if not header and first:
            return None
        if len(header) != _PART_HEADER.size:
            raise MXNetError("Invalid RecordIO file %s: it ends inside a record header" % where())
        magic, lrec = _PART_HEADER.unpack(header)
        if magic != _MAGIC:
            raise MXNetError("Invalid RecordIO file %s: expected the magic number 0x%08x at a record header, "
                             "found 0x%08x" % (where(), _MAGIC, magic))
        cflag, length = lrec >> _LENGTH_BITS, lrec & _LENGTH_MASK
        if cflag > _LAST or (first and cflag in (_MIDDLE, _LAST)) or (not first and cflag in (_WHOLE, _FIRST)):
            raise MXNetError("Invalid RecordIO file %s: part flag %d where a %s part was expected"
                             % (where(), cflag, "first or whole" if first else "middle or last"))
        padded = length + _padding(length)
        body = read(padded)
        if len(body) != padded:
            raise MXNetError("Invalid RecordIO file %s: a record part of %d bytes is cut off after %d bytes"
                             % (where(), length, len(body)))
        payload.append(body[:length])
        if cflag in (_WHOLE, _LAST):
            return _MAGIC_BYTES.join(payload)
        first = False


class MXRecordIO:
    """Reads or writes a RecordIO file record by record.

    Parameters
    ----------
    uri : str
        Path to the record file.
    flag : str
        'w' to write (the file is truncated) or 'r' to read.

    Examples
    --------
    >>> record = mx.recordio.MXRecordIO('tmp.rec', 'w')
    >>> for i in range(5):
    ...     record.write(b'record_%d' % i)
    >>> record.close()
    >>> record = mx.recordio.MXRecordIO('tmp.rec', 'r')
    >>> record.read()
    b'record_0'
    """

    def __init__(self, uri, flag):
        self.uri = os.fspath(uri)
        self.flag = flag
        self.pid = None
        self.is_open = False
        self._file = None
        self.open()

    def open(self):
        """Open the record file (for writing it is truncated)."""
        if self.flag == "w":
            mode, self.writable = "wb", True
        elif self.flag == "r":
            mode, self.writable = "rb", False
        else:
            raise ValueError("Invalid flag %s" % self.flag)
        try:
            self._file = open(self.uri, mode)
        except OSError as e:
            raise MXNetError("MXRecordIO: cannot open '%s' for %s: %s"
                             % (self.uri, "writing" if self.writable else "reading", e)) from e
        self.pid = current_process().pid
        self.is_open = True

    def __del__(self):
        self.close()

    def __getstate__(self):
        """Pickle the path, mode and position-free state; the file is reopened on unpickling."""
        is_open = self.is_open
        self.close()
        state = dict(self.__dict__)
        state["is_open"] = is_open
        state["_file"] = None
        return state

    def __setstate__(self, state):
        was_open = state["is_open"]
        self.__dict__ = state
        self.is_open = False
        if was_open:
            self.open()

    def _check_pid(self, allow_reset=False):
        """Reading or writing one open file from several processes would interleave their
        positions: a forked copy reopens the file (``allow_reset``) or refuses."""
        if self.pid != current_process().pid:
            if allow_reset:
                self.reset()
            else:
                raise RuntimeError("Forbidden operation in multiple processes")

    def close(self):
        """Close the record file."""
        if not getattr(self, "is_open", False):
            return
        self._file.close()
        self._file = None
        self.is_open = False
        self.pid = None

    def reset(self):
        """Go back to the first record (for a writer: truncate the file to empty)."""
        self.close()
        self.open()

    def write(self, buf):
        """Append ``buf`` (bytes) as one record."""
        assert self.writable
        self._check_pid(allow_reset=False)
        if not isinstance(buf, (bytes, bytearray, memoryview)):
            raise TypeError("MXRecordIO.write expects bytes, got %s" % type(buf).__name__)
        self._file.write(encode_record(buf))

    def read(self):
        """The next record as bytes, or None after the last one."""
        assert not self.writable
        self._check_pid(allow_reset=False)
        return read_record_at(self._file.read, lambda: "'%s' (near byte %d)" % (self.uri, self._file.tell()))


class MXIndexedRecordIO(MXRecordIO):
    """A RecordIO file with an index file, for reading records by key.

    Parameters
    ----------
    idx_path : str
        Path to the index file (lines ``key<TAB>offset``).
    uri : str
        Path to the record file.
    flag : str
        'w' for write or 'r' for read.
    key_type : type
        Type of the keys (``int`` by default).

    Examples
    --------
    >>> record = mx.recordio.MXIndexedRecordIO('tmp.idx', 'tmp.rec', 'w')
    >>> for i in range(5):
    ...     record.write_idx(i, b'record_%d' % i)
    >>> record.close()
    >>> record = mx.recordio.MXIndexedRecordIO('tmp.idx', 'tmp.rec', 'r')
    >>> record.read_idx(3)
    b'record_3'
    """

    def __init__(self, idx_path, uri, flag, key_type=int):
        self.idx_path = idx_path
        self.idx = {}
        self.keys = []
        self.key_type = key_type
        self.fidx = None
        super().__init__(uri, flag)

    def open(self):
        super().open()
        self.idx = {}
        self.keys = []
        try:
            self.fidx = open(self.idx_path, self.flag)
        except OSError as e:
            super().close()
            raise MXNetError("MXIndexedRecordIO: cannot open index file '%s': %s" % (self.idx_path, e)) from e
        if not self.writable:
            for number, line in enumerate(self.fidx, 1):
                fields = line.strip().split("\t")
                if fields == [""]:
                    continue
                if len(fields) != 2:
                    raise MXNetError("Invalid index file '%s' line %d: expected 'key<TAB>offset', got %r"
                                     % (self.idx_path, number, line))
                key = self.key_type(fields[0])
                self.idx[key] = int(fields[1])
                self.keys.append(key)

    def close(self):
        """Close the record and index files."""
        if not getattr(self, "is_open", False):
            return
        super().close()
        self.fidx.close()

    def __getstate__(self):
        state = super().__getstate__()
        state["fidx"] = None
        return state

    def seek(self, idx):
        """Move the read position to the record with key ``idx``."""
        assert not self.writable
        self._check_pid(allow_reset=True)
        self._file.seek(self.idx[idx])

    def tell(self):
        """The byte offset the next record will be written at."""
        assert self.writable
        return self._file.tell()

    def read_idx(self, idx):
        """The record with key ``idx``."""
        self.seek(idx)
        return self.read()

    def write_idx(self, idx, buf):
        """Append ``buf`` as the record with key ``idx``."""
        key = self.key_type(idx)
        pos = self.tell()
        self.write(buf)
        self.fidx.write("%s\t%d\n" % (str(key), pos))
        self.idx[key] = pos
        self.keys.append(key)


IRHeader = namedtuple("HEADER", ["flag", "label", "id", "id2"])
"""The header of an image record.

flag : int
    0 when ``label`` is one number; otherwise the number of float32 labels stored after the
    header (``pack`` sets it).
label : float or array of float
    The label(s).
id : int
    The record's id (im2rec writes the image's index).
id2 : int
    Higher bits of the id, usually 0.
"""

_IR_FORMAT = "<IfQQ"
_IR_SIZE = struct.calcsize(_IR_FORMAT)


def pack(header, s):
    """Prefix ``s`` (bytes) with an image record header. ``header.label`` may be a number or an
    array; an array is stored as float32 after the header and ``flag`` becomes its size."""
    header = IRHeader(*header)
    if isinstance(header.label, numbers.Number):
        header = header._replace(flag=0)
    else:
        label = np.asarray(header.label, dtype=np.float32)
        header = header._replace(flag=label.size, label=0)
        s = label.tobytes() + s
    return struct.pack(_IR_FORMAT, *header) + s


def unpack(s):
    """Split a record made by ``pack`` into (IRHeader, payload bytes)."""
    if len(s) < _IR_SIZE:
        raise MXNetError("unpack: an image record starts with a %d-byte header, got %d bytes" % (_IR_SIZE, len(s)))
    header = IRHeader(*struct.unpack(_IR_FORMAT, s[:_IR_SIZE]))
    s = s[_IR_SIZE:]
    if header.flag > 0:
        if len(s) < header.flag * 4:
            raise MXNetError("unpack: the header announces %d float32 labels but only %d bytes follow"
                             % (header.flag, len(s)))
        header = header._replace(label=np.frombuffer(s, np.float32, header.flag).copy())
        s = s[header.flag * 4:]
    return header, s


def _pillow():
    try:
        from PIL import Image
    except ImportError as e:
        raise ImportError("mx.recordio's image functions need Pillow: install it with `pip install pillow`") from e
    return Image


def decode_image(data, iscolor):
    """OpenCV's ``imdecode(data, iscolor)`` with Pillow: a uint8 NumPy array in BGR(A) order,
    (H, W) for grayscale. ``iscolor``: 1 color, 0 grayscale, -1 as stored."""
    Image = _pillow()
    try:
        with Image.open(_io.BytesIO(data)) as picture:
            if iscolor == 1:
                picture = picture.convert("RGB")
            elif iscolor == 0:
                picture = picture.convert("L")
            elif picture.mode not in ("L", "RGB", "RGBA", "I;16"):
                has_alpha = "A" in picture.mode or "transparency" in picture.info
                picture = picture.convert("RGBA" if has_alpha else "RGB")
            pixels = np.asarray(picture)
    except (OSError, ValueError, SyntaxError) as e:
        raise MXNetError("cannot decode the %d-byte buffer as an image: %s" % (len(data), e)) from e
    if pixels.ndim == 3:
        channels = [2, 1, 0, 3][:pixels.shape[2]]
        pixels = pixels[:, :, channels]
    return np.ascontiguousarray(pixels)


def unpack_img(s, iscolor=-1):
    """Split a record made by ``pack_img`` into (IRHeader, image) with the image decoded as
    OpenCV does: a uint8 NumPy array in BGR order ((H, W) for grayscale). ``iscolor``: 1 color,
    0 grayscale, -1 as stored."""
    header, s = unpack(s)
    return header, decode_image(s, iscolor)


_PILLOW_FORMATS = {".jpg": "JPEG", ".jpeg": "JPEG", ".png": "PNG", ".bmp": "BMP", ".tif": "TIFF", ".tiff": "TIFF",
                   ".webp": "WEBP"}


def pack_img(header, img, quality=95, img_fmt=".jpg"):
    """Encode ``img`` (a uint8 NumPy array in OpenCV's BGR order, or (H, W) grayscale) and pack
    it with ``header``.

    quality : JPEG quality 1-100, or PNG compression level 0-9 (larger values mean 9).
    img_fmt : '.jpg' / '.jpeg' or '.png' (also '.bmp', '.tif', '.webp').
    """
    fmt = _PILLOW_FORMATS.get(img_fmt.lower())
    if fmt is None:
        raise ValueError("pack_img: unsupported image format %r; use one of %s" % (img_fmt, sorted(_PILLOW_FORMATS)))
    img = np.asarray(img)
    if img.dtype != np.uint8:
        raise ValueError("pack_img expects a uint8 image, got dtype %s" % img.dtype)
    if img.ndim == 3 and img.shape[2] == 1:
        img = img[:, :, 0]
    if img.ndim == 3 and img.shape[2] in (3, 4):
        img = img[:, :, [2, 1, 0, 3][:img.shape[2]]]
    elif img.ndim != 2:
        raise ValueError("pack_img expects an (H, W), (H, W, 1), (H, W, 3) or (H, W, 4) image, got shape %s"
                         % (img.shape,))
    options = {}
    if fmt == "JPEG":
        options["quality"] = int(quality)
    elif fmt == "PNG":
        # OpenCV clamps the PNG compression level (so the default quality of 95 means 9).
        options["compress_level"] = min(max(int(quality), 0), 9)
    buf = _io.BytesIO()
    _pillow().fromarray(np.ascontiguousarray(img)).save(buf, format=fmt, **options)
    return pack(header, buf.getvalue())
