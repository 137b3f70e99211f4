"""How golden payloads are stored: zstandard frames next to a plain, reviewable manifest.

A golden payload (``dump.json``, ``construct.json``, ``metrics.jsonl``) is stored as
``<name>.zst``, one zstandard frame at :data:`LEVEL`. Why zstandard at level 9, measured on the
committed suite (37.2 MB of plain payloads, 165 files, 2-core CPU): zstd -9 stores 2.44 MB (15.2x)
and decompresses the whole suite in 0.03 s; gzip -9 stores 2.85 MB and takes 0.08 s; zstd -19
saves another 0.5 MB at 39 s of compression per re-record (docs/goldens.md).

Reading is bounded: a payload may not decompress to more than the size its manifest records (and
never to more than :data:`MAX_CONTENT_BYTES`), so a corrupt or hostile frame cannot exhaust memory.
"""

from __future__ import annotations

from precision_harness.errors import GoldenCorruptError

CODEC = "zstd"
SUFFIX = ".zst"
LEVEL = 9
#: no golden payload may claim or produce more than this (a decompression bomb is refused)
MAX_CONTENT_BYTES = 4 << 30
_CHUNK = 1 << 20
#: the first line of a Git LFS pointer file: the payload was not fetched (``git lfs pull``)
LFS_POINTER = b"version https://git-lfs.github.com/spec/v1"
#: the ``.gitattributes`` line that routes golden payloads, and nothing else, through Git LFS
LFS_ATTRIBUTES = "golden/**/*.zst filter=lfs diff=lfs merge=lfs -text"


def compress(content: bytes) -> bytes:
    """One zstandard frame of ``content`` (deterministic for a given zstandard version and level)."""
    import zstandard

    return zstandard.ZstdCompressor(level=LEVEL, write_content_size=True).compress(content)


def decompress(stored: bytes, *, content_bytes: int, shown: str) -> bytes:
    """The content of a stored payload, which must be exactly ``content_bytes`` long.

    Raises:
        GoldenCorruptError: a Git LFS pointer instead of the payload, a truncated or corrupt frame,
            or content longer than recorded or than :data:`MAX_CONTENT_BYTES` (a decompression bomb);
            the message names the file (``shown``).
    """
    import zstandard

    if stored.startswith(LFS_POINTER):
        raise GoldenCorruptError(f"{shown}: a Git LFS pointer, not the payload; run: git lfs pull")
    if not 0 <= content_bytes <= MAX_CONTENT_BYTES:
        raise GoldenCorruptError(
            f"{shown}: manifest records {content_bytes} content bytes; refused (limit {MAX_CONTENT_BYTES})"
        )
    chunks, size = [], 0
    try:
        with zstandard.ZstdDecompressor().stream_reader(stored) as reader:
            # in bounded chunks: a hostile manifest cannot make one read allocate its claimed size
            while size <= content_bytes and (chunk := reader.read(min(_CHUNK, content_bytes + 1 - size))):
                chunks.append(chunk)
                size += len(chunk)
    except zstandard.ZstdError as exc:
        raise GoldenCorruptError(
            f"{shown}: corrupt or truncated zstandard payload ({exc}); restore it from git or re-record the golden"
        ) from None
    content = b"".join(chunks)
    if len(content) > content_bytes:
        raise GoldenCorruptError(
            f"{shown}: decompresses to more than the {content_bytes} bytes its manifest records; refused "
            "(a corrupt or hostile payload); restore it from git or re-record the golden"
        )
    if len(content) < content_bytes:
        raise GoldenCorruptError(
            f"{shown}: decompresses to {len(content)} of the {content_bytes} bytes its manifest records (truncated); "
            "restore it from git or re-record the golden"
        )
    return content
