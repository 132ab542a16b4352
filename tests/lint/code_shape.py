#!/usr/bin/env python3
"""The shape limits of a source folder: no file over --max-file-lines lines and
no function over --max-function-lines (from its signature to its closing
brace). Used on src/train/cuda/ (the GPU code's map, docs/architecture.md).

Functions are found by brace matching over the text with comments and string
literals blanked: a `{` opens a function body when the text since the last
`;`, `{` or `}` has a `)` and is not a control statement, a namespace, a
class, struct, enum or union head, or an initializer (`=`). A function inside
a class counts on its own; lambdas count inside their function.
Exit 0 within the limits, 1 naming each file or function over them.
"""
import argparse
import pathlib
import re
import sys

CONTROL = re.compile(r'^\s*(if|for|while|switch|catch|else|do|return)\b')
AGGREGATE = re.compile(r'\b(namespace|class|struct|enum|union)\b')


def blank_comments_and_strings(src):
    out, i, n = [], 0, len(src)
    while i < n:
        if src.startswith('//', i):
            j = src.find('\n', i)
            i = n if j < 0 else j
        elif src.startswith('/*', i):
            j = src.find('*/', i + 2)
            j = n if j < 0 else j + 2
            out.append('\n' * src.count('\n', i, j))
            i = j
        elif src[i] in '"\'' and not (src[i] == "'" and i > 0 and src[i - 1].isalnum()):
            q, j = src[i], i + 1
            while j < n and src[j] != q and src[j] != '\n':
                j += 2 if src[j] == '\\' else 1
            out.append(q + q)
            i = j + 1
        else:
            out.append(src[i])
            i += 1
    return ''.join(out)


def functions(text):
    """(name, first line, line count) of each outermost function body."""
    s = blank_comments_and_strings(text)
    found, stack, last, line = [], [], 0, 1
    for i, c in enumerate(s):
        if c == '\n':
            line += 1
        if c not in ';{}':
            continue
        if c == '{':
            head = s[last:i]
            flat = ' '.join(head.split())
            before_paren = flat.split('(')[0]
            is_fn = (')' in flat and not CONTROL.match(flat) and not AGGREGATE.search(before_paren)
                     and not flat.endswith('=') and '=' not in before_paren.replace('operator=', ''))
            inside_fn = any(f for f, _, _ in stack)
            first = line - head[len(head) - len(head.lstrip()):].count('\n')
            words = before_paren.split()
            stack.append((is_fn and not inside_fn, first, words[-1] if words else '?'))
        elif c == '}' and stack:
            is_fn, first, name = stack.pop()
            if is_fn:
                found.append((name, first, line - first + 1))
        last = i + 1
    return found


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('folder')
    ap.add_argument('--max-file-lines', type=int, default=500)
    ap.add_argument('--max-function-lines', type=int, default=80)
    a = ap.parse_args()
    over, files = [], 0
    for p in sorted(pathlib.Path(a.folder).iterdir()):
        if p.suffix not in ('.cc', '.cu', '.h', '.cuh'):
            continue
        files += 1
        text = p.read_text()
        n = text.count('\n')
        if n > a.max_file_lines:
            over.append(f'{p}: {n} lines (at most {a.max_file_lines})')
        for name, first, count in functions(text):
            if count > a.max_function_lines:
                over.append(f'{p}:{first}: {name}: {count} lines (at most {a.max_function_lines})')
    for o in over:
        print(o)
    print(f'{files} files, {len(over)} over the limits')
    return 1 if over or files == 0 else 0


if __name__ == '__main__':
    sys.exit(main())
