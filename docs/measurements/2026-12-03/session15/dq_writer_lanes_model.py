# Session 15: session 14's protocol model (dq_blocks_protocol_model.py there) with the dQ writer as a whole warp,
# as the hanging branch had it: besides lane 0 (waits on dq_full, frees the stage on dq_empty), a second lane that
# only waits on dq_full and meets lane 0 at __syncwarp after every block. The scheduler runs that lane only every
# `lag` rounds (a divergent path the warp scheduler leaves waiting). With lag 1 every job mix finishes; with a long
# lag the lane is lapped -- the stage completes its phase and the next before the lane looks, its parity wait then
# waits for a phase that has come round unfinished, and lane 0 waits for it at __syncwarp: deadlock. With the writer
# as one thread (lag None, 5173788) nothing waits without arriving, and every mix finishes at any lag. The same
# lapping deadlocks main's former layout (whole partials, one stage; see the last lines): there the refill took a whole
# step on the GPU, so the lane would have had to be left waiting that long, and no run was seen to hang.
import itertools
class MBar:
    def __init__(s, count): s.count=count; s.pending=0; s.done=0
    def arrive(s, n=1):
        s.pending+=n
        assert s.pending<=s.count, "overflow"
        if s.pending==s.count: s.pending=0; s.done+=1
    def ready(s, parity): return (s.done % 2) != parity
class Ring:
    def __init__(s, stages, prod, cons): s.n=stages; s.full=[MBar(prod) for _ in range(stages)]; s.empty=[MBar(cons) for _ in range(stages)]
    def st(s,p): return p % s.n
    def ph(s,p): return (p//s.n)&1
class Named:
    def __init__(s): s.arr={}; s.gen={}
def W(cond, what='wait'): # wait helper
    while not cond(): yield what
def run(jobs_steps, q_stages=2, do_stages=1, blocks=4, dq_stages=2, lag=None):
    WG=2
    qr=Ring(q_stages,1,2*128); dr=Ring(do_stages,1,2*128) if do_stages!=q_stages else None
    kv=Ring(1,1,2*128); jr=Ring(2,1,2*128+1)
    dq=[Ring(dq_stages,128,1) for _ in range(WG)]
    named={}  # id -> [arrived, generation]
    def nbar(i,n):
        b=named.setdefault(i,[0,0]); g=b[1]; b[0]+=1
        if b[0]==n: b[0]=0; b[1]+=1
        while b[1]==g: yield 'bar '+str(i)
    def acquire(r,p,what='acquire'): yield from W(lambda: r.empty[r.st(p)].ready(r.ph(p)^1), what+' %d'%p)
    def cwait(r,p,what='cwait'): yield from W(lambda: r.full[r.st(p)].ready(r.ph(p)), what+' %d'%p)
    def loader():
        steps=0
        for j,ns in enumerate(jobs_steps+[-1]):
            yield from acquire(jr,j); jr.full[jr.st(j)].arrive()
            if ns<0: break
            yield from acquire(kv,j); kv.full[0].arrive()
            for s in range(ns):
                yield from acquire(qr,steps); qr.full[qr.st(steps)].arrive()
                if dr: yield from acquire(dr,steps); dr.full[dr.st(steps)].arrive()
                steps+=1
    def mma(w):
        steps=0
        pos=lambda n,b: n*blocks+b
        def commit(p): dq[w].full[dq[w].st(p)].arrive(128)
        for j in itertools.count():
            yield from cwait(jr,j); jr.empty[jr.st(j)].arrive(128)
            ns=jobs_steps[j] if j<len(jobs_steps) else -1
            if ns<0: return
            yield from cwait(kv,j)
            for s in range(ns):
                yield from cwait(qr,steps)
                if dr: yield from cwait(dr,steps)
                if s>0: commit(pos(steps-1,blocks-1))
                yield from nbar('free',2)
                yield from nbar('wg%d'%w,1)
                if dr: dr.empty[dr.st(steps)].arrive(128)
                yield from nbar('ready',2)
                for b in range(blocks):
                    if b>0: commit(pos(steps,b-1))
                    yield from acquire(dq[w],pos(steps,b))
                qr.empty[qr.st(steps)].arrive(128)
                steps+=1
            if ns>0: commit(pos(steps-1,blocks-1))
            kv.empty[0].arrive(128)
    def writer():
        steps=0
        for j in itertools.count():
            yield from cwait(jr,j); jr.empty[jr.st(j)].arrive(1)
            ns=jobs_steps[j] if j<len(jobs_steps) else -1
            if ns<0: return
            for s in range(ns):
                for b in range(blocks):
                    p=steps*blocks+b
                    for w in range(WG): yield from cwait(dq[w],p)
                    for w in range(WG): dq[w].empty[dq[w].st(p)].arrive(1)
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
                steps+=1
    actors={'loader':loader(),'mma0':mma(0),'mma1':mma(1),'writer':writer()}
    if lag is not None: actors['follower']=follower()
    state={k:None for k in actors}
    for it in range(200000):
        progressed=False; alive=False
        for k,g in list(actors.items()):
            if g is None: continue
            alive=True
            if k=='follower' and it % lag: continue
            try:
                r=next(g)
                # a generator yielding 'wait' repeatedly: detect progress by trying again later
                pass
                state[k]=r
            except StopIteration:
                actors[k]=None; progressed=True
        if not alive: return 'ok'
    return 'deadlock? ' + str(state)
if __name__ == '__main__':
    mixes = ([4], [1, 1], [3, 2], [4, 4, 4], [1], [2], [5, 1, 3])
    for lag in (None, 1, 50):
        print('lag', lag, [run(js, lag=lag)[:40] for js in mixes])
    for lag in (None, 1, 50):
        print('whole partials, one stage, lag', lag, run([3, 2], blocks=1, dq_stages=1, lag=lag)[:120])
