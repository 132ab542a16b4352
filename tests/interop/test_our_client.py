"""Our C++ client (store_probe) against PyTorch's own TCPStore server, and the
keys each side writes visible to the other under the same names."""
import datetime
import os
import subprocess

import torch
import torch.distributed as dist

from storeutil import BIN, check, reserved_port, torch_major


def run_probe(use_libuv):
    reserved = reserved_port()
    port = reserved.port
    kwargs = dict(is_master=True, wait_for_workers=False, timeout=datetime.timedelta(seconds=30))
    if use_libuv is not None:
        kwargs["use_libuv"] = use_libuv
    server = dist.TCPStore("127.0.0.1", port, **kwargs)
    server.set("from_torch", b"\x00torch")
    args = [os.path.join(BIN, "store_probe"), "127.0.0.1", str(port)]
    if torch_major() < 2:
        args += ["--expect-dialect", "legacy"]
    elif not use_libuv:
        args += ["--skip", "queues,listkeys"]  # PyTorch's non-libuv backend lacks them
    p = subprocess.run(args, capture_output=True, text=True, timeout=120)
    label = "PyTorch %s server (use_libuv=%s)" % (torch.__version__, use_libuv)
    check(p.returncode == 0, "store_probe vs %s:\n%s%s" % (label, p.stdout, p.stderr))
    check(server.get("from_ddprun") == b"hello from ddprun", "key set by our client not visible")
    check(server.get("counter") == b"-3", "our ADDs as PyTorch sees them")
    check(server.get("bin") == b"\x00\x01\xff", "binary value from our client")
    print("store_probe passed against " + label)
    reserved.close()


def main():
    if torch_major() < 2:
        run_probe(None)
        return
    run_probe(True)
    run_probe(False)


if __name__ == "__main__":
    main()
