#!/usr/bin/env python3
"""cu2emu.py: mirror CUDA sources into a directory the host C++ compiler can build against the CUDA
emulation (dev/cuda_emu/include), rewriting the two constructs of the CUDA language that are not C++:

  kernel<tmpl><<<grid, block[, smem[, stream]]>>>(args);
      -> emu::launch("kernel<tmpl>", kernel<tmpl>, emu::LaunchCfg(grid, block[, smem[, stream]]),
                     __FILE__, __LINE__, [=]() { kernel<tmpl>(args); });
  __shared__ T a[N], b[M];          (inside device code)
      -> EMU_SHARED(T, a, [N]); EMU_SHARED(T, b, [M]);
  extern __shared__ T a[];
      -> EMU_DYNAMIC_SHARED(T, a);

Why a rewriting step and not a macro: `<<<` cannot be produced or consumed by the preprocessor, so a
macro would have to replace the launch syntax in the committed sources (un-CUDA-like code that a CUDA
programmer would not write, and a second spelling of 45 launch sites to keep in step). The rewrite is
mechanical, leaves everything else byte for byte, keeps every line on its line (no newline is added
or removed; the script checks it) and starts each output file with a #line directive naming the
original, so every compiler message, __FILE__/__LINE__ and assert names the original file and line.
The launch's arguments go through a lambda that calls the kernel: the arguments convert to the
kernel's parameter types exactly as in the launch (NULL to a pointer, int to size_t), and every
emulated thread gets its own copy of the parameters.

Comments, string and character literals are never rewritten. A launch or __shared__ declaration the
script cannot parse is an error (file:line), never a silent pass-through.

usage: cu2emu.py --out DIR [--root ROOT] FILE...   (FILE relative to ROOT, mirrored to DIR/FILE;
       files whose output would not change are not rewritten, so make's timestamps stay useful)
"""
import argparse
import os
import re
import sys


class RewriteError(Exception):
    pass


def code_mask(src):
    """a list of booleans: True where src[i] is code (not inside a comment or a literal)"""
    n = len(src)
    mask = [True] * n
    i = 0
    while i < n:
        c = src[i]
        if c == '/' and i + 1 < n and src[i + 1] == '/':
            j = src.find('\n', i)
            j = n if j < 0 else j
            for k in range(i, j):
                mask[k] = False
            i = j
        elif c == '/' and i + 1 < n and src[i + 1] == '*':
            j = src.find('*/', i + 2)
            j = n if j < 0 else j + 2
            for k in range(i, j):
                mask[k] = False
            i = j
        elif c == '"' or c == "'":
            # raw strings are not used by the project; a plain literal ends at the unescaped quote
            j = i + 1
            while j < n and src[j] != c:
                if src[j] == '\\':
                    j += 1
                if src[j] == '\n':
                    break
                j += 1
            for k in range(i, min(j + 1, n)):
                mask[k] = False
            i = j + 1
        else:
            i += 1
    return mask


def line_of(src, pos):
    return src.count('\n', 0, pos) + 1


def match_forward(src, mask, i, open_c, close_c):
    """src[i] == open_c; index of the matching close_c (nesting of (), [], {} counted)"""
    depth = 0
    pairs = {'(': ')', '[': ']', '{': '}'}
    stack = []
    j = i
    while j < len(src):
        if mask[j]:
            c = src[j]
            if c in pairs:
                stack.append(pairs[c])
            elif c in ')]}':
                if not stack or stack[-1] != c:
                    raise RewriteError('unbalanced %r' % c)
                stack.pop()
                if not stack:
                    return j
        j += 1
    raise RewriteError('no closing %r' % close_c)


def find_cfg_end(src, mask, i):
    """i just after '<<<': index of the '>>>' closing the launch configuration (outside brackets)"""
    depth = 0
    j = i
    while j < len(src):
        if mask[j]:
            c = src[j]
            if c in '([{':
                depth += 1
            elif c in ')]}':
                depth -= 1
            elif c == '>' and depth == 0 and src.startswith('>>>', j):
                return j
            elif c == ';' and depth == 0:
                break
        j += 1
    raise RewriteError('no ">>>" closing the launch configuration')


IDENT = re.compile(r'[A-Za-z_][A-Za-z_0-9]*$')


def kernel_expr_start(src, mask, end):
    """end: index of the first '<' of '<<<'. Returns the start of the kernel expression before it:
    an identifier (possibly qualified with ::) with optional template arguments <...>."""
    j = end - 1
    while j >= 0 and src[j] in ' \t':
        j -= 1
    if j >= 0 and src[j] == '>':   # template arguments: walk back to the matching '<'
        depth = 0
        while j >= 0:
            if mask[j]:
                if src[j] == '>':
                    depth += 1
                elif src[j] == '<':
                    depth -= 1
                    if depth == 0:
                        break
            j -= 1
        if j < 0:
            raise RewriteError('unbalanced template arguments before "<<<"')
        j -= 1
        while j >= 0 and src[j] in ' \t':
            j -= 1
    # identifier (with :: qualifiers)
    k = j
    while k >= 0 and (src[k].isalnum() or src[k] in '_:'):
        k -= 1
    start = k + 1
    name = src[start:j + 1]
    if not name or not re.match(r'[A-Za-z_:][A-Za-z_0-9:]*$', name):
        raise RewriteError('cannot find the kernel name before "<<<"')
    return start


def rewrite_launches(src, path):
    out = []
    pos = 0
    mask = code_mask(src)
    i = 0
    while True:
        i = src.find('<<<', i)
        if i < 0:
            break
        if not mask[i]:
            i += 3
            continue
        try:
            ks = kernel_expr_start(src, mask, i)
            kexpr = src[ks:i].rstrip()
            ce = find_cfg_end(src, mask, i + 3)
            cfg = src[i + 3:ce]
            a = ce + 3
            while a < len(src) and src[a] in ' \t\n':
                a += 1
            if a >= len(src) or src[a] != '(':
                raise RewriteError('no argument list after ">>>"')
            ae = match_forward(src, mask, a, '(', ')')
        except RewriteError as e:
            raise RewriteError('%s:%d: kernel launch: %s' % (path, line_of(src, i), e))
        name = ' '.join(kexpr.split())
        args = src[a + 1:ae]
        between = src[ce + 3:a]   # whitespace (maybe newlines) between >>> and (
        out.append(src[pos:ks])
        out.append('emu::launch("%s", %s, emu::LaunchCfg(%s),%s __FILE__, __LINE__, [=]() { %s(%s); })'
                   % (name, kexpr, cfg, between, kexpr, args))
        pos = ae + 1
        i = ae + 1
    out.append(src[pos:])
    return ''.join(out)


DECL_RE = re.compile(r'^(?P<name>[A-Za-z_][A-Za-z_0-9]*)\s*(?P<dims>(\[[^\]]*\]\s*)*)$')


def split_top(s, sep):
    parts, depth, cur = [], 0, []
    for c in s:
        if c in '([{<':
            depth += 1
        elif c in ')]}>':
            depth -= 1
        if c == sep and depth == 0:
            parts.append(''.join(cur))
            cur = []
        else:
            cur.append(c)
    parts.append(''.join(cur))
    return parts


def rewrite_shared(src, path):
    mask = code_mask(src)
    out = []
    pos = 0
    for m in re.finditer(r'\b__shared__\b', src):
        i = m.start()
        if not mask[i]:
            continue
        # the statement: from the start of the declaration to ';'
        j = src.find(';', m.end())
        if j < 0:
            raise RewriteError('%s:%d: __shared__ declaration without ";"' % (path, line_of(src, i)))
        body = src[m.end():j]
        if '\n' in body:
            raise RewriteError('%s:%d: a __shared__ declaration must fit on one line' % (path, line_of(src, i)))
        # "extern" (and other specifiers) may stand before __shared__ on the same line
        ls = src.rfind('\n', 0, i) + 1
        before = src[ls:i]
        is_extern = re.search(r'\bextern\s*$', before) is not None
        start = i
        if is_extern:
            start = ls + re.search(r'\bextern\s*$', before).start()
        decls = [d.strip() for d in split_top(body, ',')]
        first = decls[0]
        mm = re.match(r'^(?P<type>.*?)\b(?P<decl>[A-Za-z_][A-Za-z_0-9]*\s*(\[[^\]]*\]\s*)*)$', first)
        if not mm or not mm.group('type').strip():
            raise RewriteError('%s:%d: cannot parse the __shared__ declaration %r' % (path, line_of(src, i), first))
        typ = mm.group('type').strip()
        items = [mm.group('decl')] + decls[1:]
        stmts = []
        for d in items:
            dm = DECL_RE.match(d.strip())
            if not dm:
                raise RewriteError('%s:%d: cannot parse the __shared__ declarator %r' % (path, line_of(src, i), d))
            name, dims = dm.group('name'), dm.group('dims').strip()
            if is_extern:
                if dims.replace(' ', '') != '[]':
                    raise RewriteError('%s:%d: extern __shared__ must be an array of unknown size' % (path, line_of(src, i)))
                stmts.append('EMU_DYNAMIC_SHARED(%s, %s)' % (typ, name))
            else:
                if ',' in typ:
                    raise RewriteError('%s:%d: __shared__ type with a comma: use a typedef' % (path, line_of(src, i)))
                stmts.append('EMU_SHARED(%s, %s, %s)' % (typ, name, dims))
        out.append(src[pos:start])
        out.append('; '.join(stmts))
        pos = j   # keep the ';'
    out.append(src[pos:])
    return ''.join(out)


def rewrite(src, path):
    res = rewrite_shared(rewrite_launches(src, path), path)
    if res.count('\n') != src.count('\n'):
        raise RewriteError('%s: internal: the rewrite changed the line count' % path)
    return '#line 1 "%s"\n' % path + res


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--out', required=True)
    ap.add_argument('--root', default='.')
    ap.add_argument('files', nargs='+')
    a = ap.parse_args()
    try:
        for f in a.files:
            with open(os.path.join(a.root, f), encoding='utf-8') as fh:
                src = fh.read()
            res = rewrite(src, f)
            dst = os.path.join(a.out, f)
            os.makedirs(os.path.dirname(dst) or '.', exist_ok=True)
            old = None
            if os.path.exists(dst):
                with open(dst, encoding='utf-8') as fh:
                    old = fh.read()
            if old != res:
                with open(dst, 'w', encoding='utf-8') as fh:
                    fh.write(res)
    except RewriteError as e:
        print('cu2emu: error: %s' % e, file=sys.stderr)
        return 1
    return 0


if __name__ == '__main__':
    sys.exit(main())
