#!/usr/bin/env python3
"""dev/cubin_same.py OLD NEW: whether two CUDA builds compiled to the same kernel code.

OLD and NEW are executables or cubins. For executables, the cubin named by --cubin (default
kda_decode.sm_90a.cubin) is extracted with cuobjdump -xelf (python3 -m pip install --target
/tmp/cuobj nvidia-cuda-cuobjdump; CUOBJDUMP names the binary). Compares every `.text.<kernel>`
section byte for byte, so a refactor that must not change the generated code is checked here,
without the device and without nvdisasm (line tables, which move with the source, are ignored).
Exit status 0 when every kernel's code is identical. --rename=FROM=TO (repeatable) renames an
OLD kernel that NEW lacks by replacing FROM with TO in its mangled name, for a kernel that gained
a template argument (session 22: --rename=EEEvNS1_6ParamsE=ELi8EEEvNS1_6ParamsE for the
precompute-group kernel's kTokens); new kernels without a counterpart are listed, not failed.
"""
import os
import shutil
import struct
import subprocess
import sys
import tempfile


def text_sections(data):
    """{section name: bytes} of the .text.* sections of an ELF64 little-endian image."""
    shoff = struct.unpack_from("<Q", data, 0x28)[0]
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)

    def header(i):
        return struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize)

    names = header(shstrndx)[4]
    out = {}
    for i in range(shnum):
        name, _, _, _, offset, size, *_ = header(i)
        label = data[names + name:data.index(b"\0", names + name)].decode()
        if label.startswith(".text."):
            out[label] = data[offset:offset + size]
    return out


def cubin_bytes(path, cubin, tmp):
    data = open(path, "rb").read()
    if data[:4] == b"\x7fELF" and struct.unpack_from("<H", data, 0x12)[0] == 190:  # EM_CUDA
        return data
    tool = os.environ.get("CUOBJDUMP") or shutil.which("cuobjdump") or \
        "/tmp/cuobj/nvidia/cu13/bin/cuobjdump"
    subprocess.run([tool, "-xelf", cubin, os.path.abspath(path)], cwd=tmp, check=True,
                   stdout=subprocess.DEVNULL)
    extracted = os.path.join(tmp, cubin)
    data = open(extracted, "rb").read()
    os.remove(extracted)
    return data


def main():
    options = [a for a in sys.argv[1:] if a.startswith("--")]
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    cubin = next((a.split("=", 1)[1] for a in options if a.startswith("--cubin=")),
                 "kda_decode.sm_90a.cubin")
    renames = [a[len("--rename="):].split("=", 1) for a in options if a.startswith("--rename=")]
    if len(args) != 2 or any(len(r) != 2 for r in renames):
        sys.exit(__doc__)
    with tempfile.TemporaryDirectory() as tmp:
        old, new = (text_sections(cubin_bytes(p, cubin, tmp)) for p in args)

    def counterpart(name):  # NEW's name for OLD's kernel `name`
        if name in new:
            return name
        for src, dst in renames:
            name = name.replace(src, dst)
        return name

    pairs = {name: counterpart(name) for name in old}
    differing = sorted(n for n, m in pairs.items() if old[n] != new.get(m))
    added = sorted(set(new) - set(pairs.values()))
    print(f"{cubin}: {len(old)} / {len(new)} kernels, {sum(map(len, old.values()))} / "
          f"{sum(map(len, new.values()))} bytes of code; {len(differing)} of OLD's differ or are "
          f"missing, {len(added)} new")
    for name in differing:
        print("  differs:", name[len(".text."):])
    for name in added:
        print("  new:", name[len(".text."):])
    sys.exit(1 if differing or not old else 0)


if __name__ == "__main__":
    main()
