"""Streamed uploads to object stores: parts in parallel, nothing visible until complete.

A checkpoint file is produced as a stream (a header, then each tensor's bytes, hashed on
the way out). :func:`open_upload` returns a writer for a remote location:

* on S3 (s3fs), :class:`MultipartUpload`: the stream is cut into parts (``part_size``,
  default 32 MiB) uploaded by ``concurrency`` parts at a time, so the network sees several
  requests in flight like ``fs.put`` does; ``close`` completes the upload (the object
  appears whole, atomically) and ``abort`` cancels it (nothing appears). A stream shorter
  than one part is a single PUT.
* on any other fsspec filesystem, the filesystem's own buffered writer
  (``fs.open(path, "wb")``), which uploads as it fills.
"""

from __future__ import annotations

import contextlib
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Protocol

from ckptkit import crashpoints
from ckptkit.storage import transfer
from ckptkit.storage.fs import Location

PART_SIZE = 50 << 20
"""Bytes per multipart part (S3 allows 5 MiB to 5 GiB; 10 000 parts at most). A stream
shorter than one part is a single PUT. 50 MiB is s3fs's own threshold, so ckptkit and
``fs.put`` make the same requests for the same file."""
CONCURRENCY = 8
"""Parts in flight at once per file (each holds a part-sized buffer)."""


class Upload(Protocol):
    """A write-only stream to a remote object."""

    def write(self, data: bytes | memoryview) -> int: ...

    def close(self) -> None:
        """Finish: the object appears whole."""
        ...

    def abort(self) -> None:
        """Cancel: nothing appears (a partial upload is discarded)."""
        ...


def open_upload(
    loc: Location, *, part_size: int | None = None, concurrency: int | None = None
) -> Upload:
    """A writer for the remote object at ``loc`` (see the module docstring)."""
    part_size = PART_SIZE if part_size is None else part_size
    concurrency = CONCURRENCY if concurrency is None else concurrency
    f, path = loc.fs, loc.path  # type: ignore[union-attr]
    if type(f).__name__ == "S3FileSystem" and hasattr(f, "call_s3"):
        return MultipartUpload(f, path, part_size=part_size, concurrency=concurrency)
    return _Buffered(transfer.open_writer(loc, block_size=part_size))


class _Buffered:
    def __init__(self, f: Any) -> None:
        self._f = f

    def write(self, data: bytes | memoryview) -> int:
        return int(self._f.write(data))

    def close(self) -> None:
        self._f.close()

    def abort(self) -> None:
        # fsspec buffered writers upload on close; discarding the buffer is enough here,
        # and whatever part was already flushed is removed by the caller's cleanup.
        discard = getattr(self._f, "discard", None)
        if callable(discard):
            discard()
        else:
            self._f.closed = True


_SPARE: list[bytearray] = []
_SPARE_LOCK = threading.Lock()
SPARE_BUFFERS = 8
"""Part buffers kept between uploads: new memory is slow to touch on many VMs, and every
save needs the same few."""


def _new_buffer(size: int) -> bytearray:
    with _SPARE_LOCK:
        for i, b in enumerate(_SPARE):
            if len(b) == size:
                return _SPARE.pop(i)
    return bytearray(size)


def _keep_buffer(buf: bytearray) -> None:
    with _SPARE_LOCK:
        if len(_SPARE) < SPARE_BUFFERS:
            _SPARE.append(buf)


class MultipartUpload:
    """An S3 multipart upload fed as a stream, ``concurrency`` parts at a time.

    Each part is copied once into one of ``concurrency + 1`` reusable buffers (the caller's
    memory may change after ``write`` returns); a buffer goes back to the pool when its part
    is acknowledged.
    """

    def __init__(self, s3: Any, path: str, *, part_size: int, concurrency: int) -> None:
        self.s3 = s3
        self.bucket, _, self.key = path.partition("/")
        self.part_size = part_size
        self._pool = ThreadPoolExecutor(concurrency, thread_name_prefix="ckptkit-upload")
        self._free: list[bytearray] = []  # allocated on demand: a small file needs one
        self._made = 0
        self._limit = concurrency + 1
        self._ready = threading.Semaphore(concurrency + 1)
        self._lock = threading.Lock()
        self._cur = self._take()
        self._fill = 0
        self._parts: list[Future[dict[str, Any]]] = []
        self._upload_id: str | None = None
        self._closed = False

    def write(self, data: bytes | memoryview) -> int:
        mv = memoryview(data).cast("B")
        n = len(mv)
        while len(mv):
            room = self.part_size - self._fill
            k = min(room, len(mv))
            self._cur[self._fill : self._fill + k] = mv[:k]
            self._fill += k
            mv = mv[k:]
            if self._fill == self.part_size:
                self._ship(self._fill)
        return n

    def _take(self) -> bytearray:
        self._ready.acquire()
        with self._lock:
            if self._free:
                return self._free.pop()
            self._made += 1
            return _new_buffer(self.part_size)

    def _give(self, buf: bytearray) -> None:
        with self._lock:
            self._free.append(buf)
        self._ready.release()

    def _ship(self, nbytes: int) -> None:
        if self._upload_id is None:
            r = self.s3.call_s3("create_multipart_upload", Bucket=self.bucket, Key=self.key)
            self._upload_id = str(r["UploadId"])
        buf, number = self._cur, len(self._parts) + 1
        for f in self._parts:
            if f.done() and f.exception() is not None:
                raise f.exception()  # type: ignore[misc]
        self._parts.append(self._pool.submit(self._put_part, buf, nbytes, number))
        self._cur = self._take()
        self._fill = 0

    def _put_part(self, buf: bytearray, nbytes: int, number: int) -> dict[str, Any]:
        try:
            r = self.s3.call_s3(
                "upload_part",
                Bucket=self.bucket,
                Key=self.key,
                PartNumber=number,
                UploadId=self._upload_id,
                Body=bytes(memoryview(buf)[:nbytes]) if nbytes < len(buf) else buf,
            )
            crashpoints.reached("upload.part")
            return {"PartNumber": number, "ETag": r["ETag"]}
        finally:
            self._give(buf)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            if self._upload_id is None:
                self.s3.call_s3(
                    "put_object",
                    Bucket=self.bucket,
                    Key=self.key,
                    Body=bytes(memoryview(self._cur)[: self._fill]),
                )
                return
            if self._fill:
                self._ship(self._fill)
            parts = [f.result() for f in self._parts]
            self.s3.call_s3(
                "complete_multipart_upload",
                Bucket=self.bucket,
                Key=self.key,
                UploadId=self._upload_id,
                MultipartUpload={"Parts": parts},
            )
        except BaseException:
            self._closed = False
            self.abort()
            raise
        finally:
            self._pool.shutdown(wait=True)
            self._recycle()
            self.s3.invalidate_cache(f"{self.bucket}/{self.key}")

    def _recycle(self) -> None:
        with self._lock:
            bufs, self._free = [*self._free, self._cur], []
        for b in bufs:
            _keep_buffer(b)

    def abort(self) -> None:
        if self._closed:
            return
        self._closed = True
        for f in self._parts:
            f.cancel()
        self._pool.shutdown(wait=True)
        self._recycle()
        if self._upload_id is not None:
            # On failure the store's lifecycle rules expire the abandoned parts.
            with contextlib.suppress(Exception):
                self.s3.call_s3(
                    "abort_multipart_upload",
                    Bucket=self.bucket,
                    Key=self.key,
                    UploadId=self._upload_id,
                )


__all__ = ["CONCURRENCY", "PART_SIZE", "MultipartUpload", "Upload", "open_upload"]
