# Protocol model of `dq_adds_from_registers_untested.patch` (branch wip/dq-adds-from-registers; d = 192 and 256:
# the MMA warpgroups add their dQ blocks from registers; the dQ writer keeps their order through DqOrder,
# src/kernels/sm90/pipeline.cuh). Several CTAs, each a dQ
# writer and a few MMA threads (each its own actor, so that one can lag behind the others), run a shift schedule
# (CTA c's step n adds to dQ tile (c + n) % tiles with rank n) whose tiles are summed in rank order through global
# semaphores. A random scheduler steps the actors until all finish or none can move. Checked on every run:
#   - no deadlock;
#   - no parity wait passes on another phase than its own (early, or lapped: the hardware tests only the parity);
#   - order: an add of rank r to a tile is issued only once the adds of every rank below r are performed.
# Negative controls, which must fail: the writer releases without waiting for the reports; the writer grants the next
# step without waiting for the previous step's reports; the MMA threads add without waiting for the grant.
import inspect
import random


class MBar:
    def __init__(self, count):
        self.count, self.pending, self.done = count, 0, 0

    def arrive(self):
        self.pending += 1
        assert self.pending <= self.count, 'arrival overflow'
        if self.pending == self.count:
            self.pending, self.done = 0, self.done + 1

    def passes(self, phase):  # the parity wait's test
        return self.done % 2 != phase % 2


def run(ctas=4, threads=3, seed=0):
    tiles = ctas  # each tile gets each rank from one CTA: at step n tile t is CTA (t - n)'s
    rng = random.Random(seed)
    semaphores = [0] * tiles
    performed = [[0] * tiles for _ in range(tiles)]  # [tile][rank]: MMA threads whose adds are performed
    errors = []

    def wait(barrier, phase, what):
        while not barrier.passes(phase):
            yield what
        if barrier.done != phase + 1:
            errors.append('%s passed phase %d with %d phases done' % (what, phase, barrier.done))

    def cta(c):
        request, grant, added = MBar(1), MBar(1), MBar(threads)
        records = [((c + n) % tiles, n) for n in range(tiles)]

        def mma(i):
            for n, (tile, rank) in enumerate(records):
                if n > 0:  # after its fence: this thread's adds of step n - 1 are performed
                    performed[records[n - 1][0]][records[n - 1][1]] += 1
                    added.arrive()
                if i == 0:
                    request.arrive()
                yield 'S, dP, dS'
                yield from wait(grant, n, 'grant')
                if any(performed[tile][lower] < threads for lower in range(rank)):
                    errors.append('rank %d added to tile %d before the ranks below were performed' % (rank, tile))
                yield 'adds'
            performed[records[-1][0]][records[-1][1]] += 1  # the job's end
            added.arrive()

        def writer():
            for n, (tile, rank) in enumerate(records):
                yield from wait(request, n, 'request')
                while semaphores[tile] != rank:
                    yield 'semaphore'
                grant.arrive()
                yield from wait(added, n, 'added')
                semaphores[tile] += 1

        return [mma(i) for i in range(threads)] + [writer()]

    actors = [actor for c in range(ctas) for actor in cta(c)]
    for _ in range(200000):
        if all(actor is None for actor in actors):
            return errors[:2] or 'ok'
        k = rng.randrange(len(actors))
        if actors[k] is not None:
            try:
                next(actors[k])
            except StopIteration:
                actors[k] = None
    return errors[:2] + ['deadlock']


if __name__ == '__main__':
    runs = [(ctas, threads, seed) for ctas in (2, 3, 4, 6) for threads in (1, 3) for seed in range(10)]
    failures = [(r, run(*r)) for r in runs if run(*r) != 'ok']
    print('%d random interleavings (2-6 CTAs, 1 or 3 MMA threads each): %d fail %s' %
          (len(runs), len(failures), failures[:2]))
    model = inspect.getsource(run)
    for name, old, new in (
            ('release without waiting for the reports', "yield from wait(added, n, 'added')", "pass"),
            ('grant the next step before the reports',
             "grant.arrive()\n                yield from wait(added, n, 'added')",
             "yield from (wait(added, n - 1, 'added') if n > 0 else iter(()))\n                grant.arrive()"),
            ('add without waiting for the grant', "yield from wait(grant, n, 'grant')", "pass")):
        assert old in model, name
        scope = dict(globals())
        exec(model.replace(old, new), scope)
        outcomes = [scope['run'](*r) for r in runs]
        print('control, %s: %d of %d fail, e.g. %s' %
              (name, sum(o != 'ok' for o in outcomes), len(runs), next((o for o in outcomes if o != 'ok'), 'none')))
