"""Faulty bytes: planted image payloads that are not rendered pictures.

A decompression bomb (a tiny PNG declaring an enormous size, written row by
row, never held in memory) and the non-image pages a crawler gets instead
of an image: an HTML error page, a bot check, a PDF, an SVG.
"""

from __future__ import annotations

import struct
import zlib


def _png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def bomb_png(width: int, height: int) -> bytes:
    """A valid 1-bit grey PNG of ``width x height`` white... zero pixels: tiny
    file, enormous decode. Written row by row, never held in memory."""
    row = b"\x00" + bytes((width + 7) // 8)
    compressor = zlib.compressobj(9)
    chunks = [compressor.compress(row * 256) for _ in range(height // 256)]
    chunks.append(compressor.compress(row * (height % 256)))
    chunks.append(compressor.flush())
    header = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + _png_chunk(b"IHDR", header) + _png_chunk(b"IDAT", b"".join(chunks))
            + _png_chunk(b"IEND", b""))


HTML_ERROR_PAGE = (
    b"<!DOCTYPE html>\n<html><head><title>404 Not Found</title></head>\n<body><h1>Not Found</h1>\n"
    b"<p>The requested URL was not found on this server.</p>\n<hr><address>Apache Server</address>\n</body></html>\n"
)
HTML_CAPTCHA_PAGE = (
    b"<html><head><meta charset=\"utf-8\"><title>Just a moment...</title></head><body>"
    b"<noscript>Please enable JavaScript and cookies to continue</noscript></body></html>"
)
PDF_DOCUMENT = (
    b"%PDF-1.4\n%\xe2\xe3\xcf\xd3\n1 0 obj\n<< /Type /Catalog /Pages 2 0 R >>\nendobj\n"
    b"2 0 obj\n<< /Type /Pages /Kids [] /Count 0 >>\nendobj\ntrailer\n<< /Root 1 0 R >>\n%%EOF\n"
)
SVG_IMAGE = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<svg xmlns="http://www.w3.org/2000/svg" width="320" height="240">'
    b'<rect width="320" height="240" fill="white"/><circle cx="160" cy="120" r="80" fill="red"/></svg>\n'
)
