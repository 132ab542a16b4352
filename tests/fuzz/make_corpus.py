"""Writes the seed corpus: one small file per request kind, both dialects,
and a few multi-request server streams. Run once; the files are committed."""
import os
import struct

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")
V2 = dict(VALIDATE=0, SET=1, COMPARE_SET=2, GET=3, ADD=4, CHECK=5, WAIT=6, GETNUMKEYS=7,
          DELETE_KEY=8, APPEND=9, MULTI_GET=10, MULTI_SET=11, CANCEL_WAIT=12, PING=13,
          QUEUE_PUSH=14, QUEUE_POP=15, QUEUE_LEN=16, LIST_KEYS=17, BARRIER=18)
LEGACY = dict(SET=0, COMPARE_SET=1, GET=2, ADD=3, CHECK=4, WAIT=5, GETNUMKEYS=6, WATCH_KEY=7,
              DELETE_KEY=8)


def s(b):
    b = b.encode() if isinstance(b, str) else b
    return struct.pack("<Q", len(b)) + b


def body(cmd):
    return {
        "VALIDATE": struct.pack("<I", 0x3C85F7CE), "PING": struct.pack("<I", 42),
        "SET": s("/k") + s("v"), "APPEND": s("/k") + s("x"), "QUEUE_PUSH": s("/q") + s("v"),
        "COMPARE_SET": s("/k") + s("") + s("n"), "GET": s("/k"), "DELETE_KEY": s("/k"),
        "QUEUE_POP": s("/q"), "QUEUE_LEN": s("/q"), "WATCH_KEY": s("/k"),
        "ADD": s("init/") + struct.pack("<q", 1), "BARRIER": s("/b") + struct.pack("<q", 2),
        "CHECK": struct.pack("<Q", 2) + s("/a") + s("/b"), "WAIT": struct.pack("<Q", 1) + s("/k"),
        "MULTI_GET": struct.pack("<Q", 2) + s("/a") + s("/b"),
        "MULTI_SET": struct.pack("<q", 2) + s("/a") + s("1") + s("/b") + s("2"),
        "GETNUMKEYS": b"", "CANCEL_WAIT": b"", "LIST_KEYS": b"",
    }[cmd]


def main():
    os.makedirs(HERE, exist_ok=True)
    hello = bytes([0]) + body("VALIDATE")
    for name, table in (("v2", V2), ("legacy", LEGACY)):
        for cmd, byte in table.items():
            data = bytes([byte]) + body(cmd)
            with open(os.path.join(HERE, "%s_%s" % (name, cmd.lower())), "wb") as f:
                f.write(data)
    # Server streams: control byte (conn id in low 2 bits, chunk len-1 above).
    stream = hello + bytes([V2["SET"]]) + body("SET") + bytes([V2["WAIT"]]) + body("WAIT") + \
        bytes([V2["ADD"]]) + body("ADD") + bytes([V2["CANCEL_WAIT"]])
    chunks = b""
    for i in range(0, len(stream), 7):
        part = stream[i:i + 7]
        chunks += bytes([((len(part) - 1) << 2) | 1]) + part
    with open(os.path.join(HERE, "stream_v2_chunks"), "wb") as f:
        f.write(chunks)


if __name__ == "__main__":
    main()
