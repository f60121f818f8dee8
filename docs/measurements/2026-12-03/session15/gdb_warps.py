# cuda-gdb: every resident warp's PC on every SM (the hung kernel's warps).
import gdb
gdb.execute("info cuda kernels")
for sm in range(140):
    try:
        gdb.execute("cuda sm %d" % sm, to_string=True)
        out = gdb.execute("info cuda warps", to_string=True)
        print("=== SM %d" % sm)
        print(out)
    except gdb.error as e:
        pass
