#!/usr/bin/env python3
"""Reads TensorBoard event files as TensorBoard does, sharing nothing with loom's writer: the
TFRecord framing (little-endian length, masked CRC-32C of the length, the record, masked
CRC-32C of the record; both CRCs checked) and the protobuf wire format decoded by hand with
TensorBoard's field numbers (Event: wall_time 1, step 2, file_version 3, summary 5; Summary:
value 1; Value: tag 1, simple_value 2). Prints {"file_version": ..., "scalars": {tag: [[step,
value], ...]}} as JSON; exits 1 naming the first damaged record.

    tensorboard_read.py LOGDIR
"""
import glob
import json
import struct
import sys


def crc32c(data):
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
    return crc ^ 0xFFFFFFFF


def masked(data):
    c = crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def varint(buf, i):
    shift = value = 0
    while True:
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return value, i


def fields(buf):
    """(field number, wire type, value) of one message; length-delimited values as bytes."""
    i = 0
    while i < len(buf):
        key, i = varint(buf, i)
        num, wt = key >> 3, key & 7
        if wt == 0:
            v, i = varint(buf, i)
        elif wt == 1:
            v, i = buf[i:i + 8], i + 8
        elif wt == 2:
            n, i = varint(buf, i)
            v, i = buf[i:i + n], i + n
        elif wt == 5:
            v, i = buf[i:i + 4], i + 4
        else:
            raise ValueError(f"wire type {wt}")
        yield num, wt, v


def records(path):
    data = open(path, "rb").read()
    i = 0
    while i < len(data):
        if i + 12 > len(data):
            sys.exit(f"{path}: a cut record at byte {i}")
        head = data[i:i + 8]
        (n,) = struct.unpack("<Q", head)
        (head_crc,) = struct.unpack("<I", data[i + 8:i + 12])
        if head_crc != masked(head):
            sys.exit(f"{path}: the length CRC of the record at byte {i} does not match")
        body = data[i + 12:i + 12 + n]
        (body_crc,) = struct.unpack("<I", data[i + 12 + n:i + 16 + n])
        if len(body) != n or body_crc != masked(body):
            sys.exit(f"{path}: the data CRC of the record at byte {i} does not match")
        yield body
        i += 16 + n


def main():
    out = {"file_version": None, "scalars": {}, "wall_time_increases": True}
    last_wall = 0.0
    files = sorted(glob.glob(f"{sys.argv[1]}/events.out.tfevents.*"))
    if not files:
        sys.exit(f"no events.out.tfevents.* in {sys.argv[1]}")
    for path in files:
        for rec in records(path):
            step, wall = 0, None
            values = []
            for num, wt, v in fields(rec):
                if num == 1 and wt == 1:
                    (wall,) = struct.unpack("<d", v)
                elif num == 2 and wt == 0:
                    step = v
                elif num == 3 and wt == 2:
                    out["file_version"] = v.decode()
                elif num == 5 and wt == 2:
                    for vn, vwt, value in fields(v):
                        if vn != 1 or vwt != 2:
                            continue
                        tag, x = None, None
                        for fn, fwt, f in fields(value):
                            if fn == 1 and fwt == 2:
                                tag = f.decode()
                            elif fn == 2 and fwt == 5:
                                (x,) = struct.unpack("<f", f)
                        values.append((tag, x))
            if wall is None:
                sys.exit(f"{path}: a record without wall_time")
            out["wall_time_increases"] &= wall >= last_wall
            last_wall = wall
            for tag, x in values:
                out["scalars"].setdefault(tag, []).append([step, x])
    print(json.dumps(out))


if __name__ == "__main__":
    main()
