# Session 15: session 14's protocol model (dq_blocks_protocol_model.py there) with the dQ writer as a whole warp,
# as the hanging branch had it: besides lane 0 (waits on dq_full, frees the stage on dq_empty), a second lane that
# only waits on dq_full and meets lane 0 at __syncwarp after every block. The scheduler runs that lane only every
# `lag` rounds (a divergent path the warp scheduler leaves waiting). With lag 1 every job mix finishes; with a long
# lag the lane is lapped -- the stage completes its phase and the next before the lane looks, its parity wait then
# waits for a phase that has come round unfinished, and lane 0 waits for it at __syncwarp: deadlock. With the writer
# as one thread (lag None, 5173788) nothing waits without arriving, and every mix finishes at any lag. The same
# lapping deadlocks main's former layout (whole partials, one stage; see the last lines): there the refill took a whole
# step on the GPU, so the lane would have had to be left waiting that long, and no run was seen to hang.
import pathlib

# Session 14's model, changed in place: a one-thread writer (the job ring's writer arrivals), and an optional follower
# lane that waits on dq_full and meets lane 0 at __syncwarp after every block.
SESSION14 = pathlib.Path(__file__).resolve().parent.parent / 'session14' / 'dq_blocks_protocol_model.py'
CHANGES = (
    ("def run(jobs_steps, q_stages=2, do_stages=1, blocks=4, dq_stages=2):",
     "def run(jobs_steps, q_stages=2, do_stages=1, blocks=4, dq_stages=2, lag=None):"),
    ("kv=Ring(1,1,2*128); jr=Ring(2,1,2*128+32)", "kv=Ring(1,1,2*128); jr=Ring(2,1,2*128+1)"),
    ("yield from cwait(jr,j); jr.empty[jr.st(j)].arrive(32)", "yield from cwait(jr,j); jr.empty[jr.st(j)].arrive(1)"),
    ("""                    for w in range(WG): dq[w].empty[dq[w].st(p)].arrive(1)
                steps+=1""", """                    for w in range(WG): dq[w].empty[dq[w].st(p)].arrive(1)
                    if lag is not None:  # __syncwarp with the follower lane
                        sync[0]+=1
                        yield from W(lambda: sync[1]>=sync[0], 'syncwarp %d'%p)
                steps+=1
    sync=[0,0]  # blocks lane 0 and the follower lane have finished
    def follower():
        steps=0
        for j,ns in enumerate(jobs_steps):
            for s in range(ns):
                for b in range(blocks):
                    p=steps*blocks+b
                    for w in range(WG): yield from cwait(dq[w],p,'follower cwait')
                    sync[1]+=1
                    yield from W(lambda: sync[0]>=sync[1], 'follower syncwarp %d'%p)
                steps+=1"""),
    ("actors={'loader':loader(),'mma0':mma(0),'mma1':mma(1),'writer':writer()}",
     "actors={'loader':loader(),'mma0':mma(0),'mma1':mma(1),'writer':writer()}\n"
     "    if lag is not None: actors['follower']=follower()"),
    ("""            if g is None: continue
            alive=True""", """            if g is None: continue
            alive=True
            if k=='follower' and it % lag: continue"""),
)
source = SESSION14.read_text()
source = source[:source.index("if __name__ == '__main__':")]
for old, new in CHANGES:
    assert old in source, old
    source = source.replace(old, new)
scope = {}
exec(source, scope)
run = scope['run']

if __name__ == '__main__':
    mixes = ([4], [1, 1], [3, 2], [4, 4, 4], [1], [2], [5, 1, 3])
    for lag in (None, 1, 50):
        print('lag', lag, [run(js, lag=lag)[:40] for js in mixes])
    for lag in (None, 1, 50):
        print('whole partials, one stage, lag', lag, run([3, 2], blocks=1, dq_stages=1, lag=lag)[:120])
