# Protocol model of branch wip/dq-column-blocks's d = 256 backward, one CTA, cross-CTA ordering waits left out: the
# loader, the two MMA warpgroups (each as one actor of 128 threads) and the dQ writer step through the mbarrier rings
# (parity waits, arrival counts) and named barriers as the kernel does, round-robin, until all finish or none can
# move. Session 14's result: every job mix tried finishes; the two negative controls at the end (no deferred commit of
# a step's last dQ block; a writer that never frees a block) deadlock, so the model can see one. The GPU hang of that
# branch is then not in this protocol; see docs/PERF.md (fourteenth session). Session 15 found it outside the model's
# actors: the dQ writer's other 31 lanes (session15/dq_writer_lanes_model.py, docs/PERF.md fifteenth session).
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
def run(jobs_steps, q_stages=2, do_stages=1, blocks=4, dq_stages=2):
    WG=2
    qr=Ring(q_stages,1,2*128); dr=Ring(do_stages,1,2*128) if do_stages!=q_stages else None
    kv=Ring(1,1,2*128); jr=Ring(2,1,2*128+32)
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
            yield from cwait(jr,j); jr.empty[jr.st(j)].arrive(32)
            ns=jobs_steps[j] if j<len(jobs_steps) else -1
            if ns<0: return
            for s in range(ns):
                for b in range(blocks):
                    p=steps*blocks+b
                    for w in range(WG): yield from cwait(dq[w],p)
                    for w in range(WG): dq[w].empty[dq[w].st(p)].arrive(1)
                steps+=1
    actors={'loader':loader(),'mma0':mma(0),'mma1':mma(1),'writer':writer()}
    state={k:None for k in actors}
    for it in range(200000):
        progressed=False; alive=False
        for k,g in list(actors.items()):
            if g is None: continue
            alive=True
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
    for js in ([4], [1, 1], [3, 2], [4, 4, 4], [1], [2], [5, 1, 3]):
        print(js, run(js))
    import inspect
    model = inspect.getsource(run)
    for name, old, new in (('no deferred commit', 'if s>0: commit(pos(steps-1,blocks-1))', 'pass'),
                           ('writer never frees', 'for w in range(WG): dq[w].empty[dq[w].st(p)].arrive(1)', 'pass')):
        scope = dict(globals())
        exec(model.replace(old, new), scope)
        print('control,', name + ':', scope['run']([3, 2])[:60])
