#!/usr/bin/env bash
# The docs stay true to the tree: every relative link in README.md and docs/*.md resolves (the
# file, and the #anchor by the usual Markdown heading-anchor rule), and every key that
# `loom train --list-keys` prints is named in docs/configuration.md.
#   docs_check.sh SOURCE_DIR LOOM
set -euo pipefail
src=${1:?usage: docs_check.sh SOURCE_DIR LOOM}
loom=${2:?usage: docs_check.sh SOURCE_DIR LOOM}

keys=$(CUDA_VISIBLE_DEVICES=-1 "$loom" train --list-keys | awk 'NR > 1 && $1 ~ /\./ {print $1}')
[ -n "$keys" ] || { echo "docs_check: '$loom train --list-keys' printed no keys"; exit 1; }

python3 - "$src" "$keys" <<'PY'
import os, re, sys

src, keys = sys.argv[1], sys.argv[2].split()
pages = [os.path.join(src, "README.md")]
docs = os.path.join(src, "docs")
pages += sorted(os.path.join(docs, f) for f in os.listdir(docs) if f.endswith(".md"))

def strip_code(text):
    """The text outside fenced blocks and inline code, where links are links."""
    out, fenced = [], False
    for line in text.split("\n"):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            out.append("")
            continue
        out.append("" if fenced else re.sub(r"`[^`]*`", "", line))
    return out

def slug(heading):
    """A heading's anchor: markup dropped, lower case, punctuation but - and _ removed, each
    space a hyphen."""
    s = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link keeps its text
    s = s.replace("`", "").strip().lower()
    s = re.sub(r"[^\w\- ]", "", s)
    return s.replace(" ", "-")

anchor_cache = {}
def anchors(path):
    """Every heading's anchor in a page; a repeated heading gets -1, -2, ... appended."""
    if path not in anchor_cache:
        seen, found, fenced = {}, set(), False
        for line in open(path, encoding="utf-8").read().split("\n"):
            if line.lstrip().startswith("```"):
                fenced = not fenced
                continue
            m = None if fenced else re.match(r"^(#{1,6})\s+(.*?)\s*#*\s*$", line)
            if m:
                base = slug(m.group(2))
                n = seen.get(base, 0)
                seen[base] = n + 1
                found.add(base if n == 0 else f"{base}-{n}")
        anchor_cache[path] = found
    return anchor_cache[path]

bad = []
for page in pages:
    rel_page = os.path.relpath(page, src)
    for lineno, line in enumerate(strip_code(open(page, encoding="utf-8").read()), 1):
        for target in re.findall(r"\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)", line):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            dest = page if not path else os.path.normpath(os.path.join(os.path.dirname(page), path))
            if not os.path.exists(dest):
                bad.append(f"{rel_page}:{lineno}: link to '{target}': no such file")
            elif anchor and dest.endswith(".md") and anchor not in anchors(dest):
                bad.append(f"{rel_page}:{lineno}: link to '{target}': no heading with anchor '#{anchor}' "
                           f"in {os.path.relpath(dest, src)}")

config_page = os.path.join(docs, "configuration.md")
text = open(config_page, encoding="utf-8").read() if os.path.exists(config_page) else ""
for key in keys:
    if not re.search(r"(?<![\w.])" + re.escape(key) + r"(?![\w])", text):
        bad.append(f"docs/configuration.md: config key '{key}' (from loom train --list-keys) is not named")

for b in bad:
    print("docs_check:", b)
if bad:
    sys.exit(1)
print(f"docs_check: {len(pages)} pages, every relative link resolves; {len(keys)} config keys named")
PY
