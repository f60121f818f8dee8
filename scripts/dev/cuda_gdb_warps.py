# cuda-gdb batch script: prints every resident warp's state and PC on every SM, so that a kernel that hangs shows
# where each of its warp roles waits. Used by scripts/dev/run_or_dump_warps.sh; SM ids past the GPU's count are skipped.
import gdb

MAX_SMS = 256

gdb.execute("info cuda kernels")
for sm in range(MAX_SMS):
    try:
        gdb.execute("cuda sm %d" % sm, to_string=True)
        out = gdb.execute("info cuda warps", to_string=True)
    except gdb.error:
        continue
    print("=== SM %d" % sm)
    print(out)
