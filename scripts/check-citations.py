#!/usr/bin/env python3
"""Checks that every "contract §N" or "contract §N.M" cited in the repository's code and docs
names a section heading of docs/contract.md, and that nothing points at a contract outside the
repository. Prints each dangling citation with its file and line; exits 1 if there is one."""
import os
import re
import subprocess
import sys

root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
os.chdir(root)
contract = open("docs/contract.md", encoding="utf-8").read()
sections = set(re.findall(r"^#+ §(\d+(?:\.\d+)?)\b", contract, re.M))
files = subprocess.run(["git", "ls-files"], capture_output=True, text=True, check=True).stdout.split()
problems = []
cited = 0
for path in files:
    if not path.endswith((".rs", ".md", ".sh", ".proto", ".toml", ".py", ".ts", ".json")):
        continue
    try:
        text = open(path, encoding="utf-8").read()
    except (OSError, UnicodeDecodeError):
        continue
    for n, line in enumerate(text.split("\n"), 1):
        if path != "scripts/check-citations.py" and re.search(r"semantics\.md|semantics §|\.\./shared/", line):
            problems.append(f"{path}:{n}: points outside the repository: {line.strip()}")
        # "contract §2–§4", "contract §1.1 and §1.4": every § on a line that cites the contract.
        if path != "docs/contract.md" and not re.search(r"[Cc]ontract §", line):
            continue
        for sec in re.findall(r"§(\d+(?:\.\d+)?)", line):
            cited += 1
            if sec not in sections:
                problems.append(f"{path}:{n}: §{sec} is not a section of docs/contract.md")
if problems:
    print(f"contract citations: {len(problems)} problem(s)")
    for p in problems:
        print("  " + p)
    sys.exit(1)
print(f"contract citations: {cited} citations, all resolve to the {len(sections)} sections of docs/contract.md")
