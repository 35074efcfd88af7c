#!/usr/bin/env python3
"""run_twice.py: run an emulated CUDA program (dev/cuda_emu) under two thread schedules and require the
same results, bit for bit.

  run_twice.py [--schedules fwd,rev] [--serial] [--quiet] -- PROGRAM [ARGS...]

Both runs get EMU_DIGEST (every device-to-host copy folded into a digest, see emu_runtime.cpp) and
EMU_SCHEDULE (the order in which the threads of a block run between barriers, and the order of the
blocks). They run side by side (one core each unless OMP_NUM_THREADS says otherwise; --serial: one
after the other). The first run's stdout is shown. Fails (exit 1) when either run fails, or when the
digests differ: then it names the first device-to-host copy that differs and the last kernel launched
before it (a race between the threads of a block: a missing __syncthreads, a read of shared memory
before it is written; or a race between blocks). Prints the wall time of the pair.
"""
import argparse
import os
import subprocess
import sys
import tempfile
import time


def read_digest(path):
    info = {'digest': None, 'bytes': None, 'copies': []}
    try:
        with open(path) as f:
            for line in f:
                p = line.split()
                if not p:
                    continue
                if p[0] in ('digest', 'bytes', 'copies'):
                    info[p[0] if p[0] != 'copies' else 'ncopies'] = p[1]
                else:
                    info['copies'].append((int(p[0]), p[1], int(p[2]), ' '.join(p[3:])))
    except OSError:
        return None
    return info


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--schedules', default='fwd,rev')
    ap.add_argument('--serial', action='store_true')
    ap.add_argument('--quiet', action='store_true', help='do not show the first run\'s stdout')
    ap.add_argument('cmd', nargs=argparse.REMAINDER)
    a = ap.parse_args()
    cmd = a.cmd[1:] if a.cmd and a.cmd[0] == '--' else a.cmd
    if not cmd:
        ap.error('no program given')
    scheds = a.schedules.split(',')
    if len(scheds) != 2:
        ap.error('--schedules wants two schedules')
    tmp = tempfile.mkdtemp(prefix='run_twice_')
    t0 = time.time()
    procs = []
    for i, s in enumerate(scheds):
        env = dict(os.environ)
        env['EMU_SCHEDULE'] = s
        env['EMU_DIGEST'] = os.path.join(tmp, 'digest%d' % i)
        env.setdefault('OMP_NUM_THREADS', '1')
        out = open(os.path.join(tmp, 'out%d' % i), 'w+')
        err = open(os.path.join(tmp, 'err%d' % i), 'w+')
        p = subprocess.Popen(cmd, env=env, stdout=out, stderr=err)
        procs.append((p, out, err))
        if a.serial:
            p.wait()
    rcs = [p.wait() for p, _, _ in procs]
    wall = time.time() - t0
    texts = []
    for p, out, err in procs:
        out.seek(0)
        err.seek(0)
        texts.append((out.read(), err.read()))
        out.close()
        err.close()
    name = os.path.basename(cmd[0])
    if not a.quiet or any(rcs):
        sys.stdout.write(texts[0][0])
        if texts[0][1]:
            sys.stdout.write(texts[0][1])
    ok = True
    for i, rc in enumerate(rcs):
        if rc != 0:
            ok = False
            print('run_twice: %s under EMU_SCHEDULE=%s exited with %d' % (name, scheds[i], rc))
            if i == 1:
                tail = texts[1][0].splitlines()[-20:] + texts[1][1].splitlines()[-20:]
                print('\n'.join('    ' + l for l in tail))
    d = [read_digest(os.path.join(tmp, 'digest%d' % i)) for i in range(2)]
    if ok:
        if d[0] is None or d[1] is None:
            print('run_twice: no digest written (is %s an emulated binary?)' % name)
            ok = False
        elif d[0]['digest'] != d[1]['digest']:
            ok = False
            c0, c1 = d[0]['copies'], d[1]['copies']
            first = None
            for x, y in zip(c0, c1):
                if x[1] != y[1] or x[2] != y[2]:
                    first = (x, y)
                    break
            print('run_twice: %s gives different results under EMU_SCHEDULE=%s and %s (digests %s, %s)'
                  % (name, scheds[0], scheds[1], d[0]['digest'], d[1]['digest']))
            if first:
                x, y = first
                print('  first differing device-to-host copy: #%d (%d bytes), after kernel %s (%s: after %s): '
                      'a race between the threads of a block or between blocks in or before it' % (x[0], x[2], x[3], scheds[1], y[3]))
            else:
                print('  the copies agree as far as both go: %d vs %d copies' % (len(c0), len(c1)))
    status = 'equal digests %s' % d[0]['digest'] if ok else 'FAILED'
    print('run_twice: %s under EMU_SCHEDULE=%s and %s: %s (%.1f s)' % (name, scheds[0], scheds[1], status, wall))
    for f in os.listdir(tmp):
        os.unlink(os.path.join(tmp, f))
    os.rmdir(tmp)
    return 0 if ok else 1


if __name__ == '__main__':
    sys.exit(main())
