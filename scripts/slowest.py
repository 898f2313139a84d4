#!/usr/bin/env python3
"""Prints the slowest tests of one or more cargo-nextest JUnit reports.

usage: scripts/slowest.py [-n N] REPORT.xml [REPORT.xml ...]
"""
import argparse
import sys
import xml.etree.ElementTree as ET


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("-n", type=int, default=10, help="how many (10)")
    parser.add_argument("reports", nargs="+")
    args = parser.parse_args()
    cases = []
    for path in args.reports:
        try:
            root = ET.parse(path).getroot()
        except (OSError, ET.ParseError) as e:
            print(f"slowest: cannot read {path}: {e}", file=sys.stderr)
            continue
        for case in root.iter("testcase"):
            cases.append((float(case.get("time", "0")), case.get("classname", ""), case.get("name", "")))
    if not cases:
        print("slowest: no test cases found", file=sys.stderr)
        return 1
    cases.sort(reverse=True)
    total = sum(t for t, _, _ in cases)
    print(f"the {min(args.n, len(cases))} slowest of {len(cases)} tests ({total:.0f} s of test time in all):")
    for t, binary, name in cases[: args.n]:
        print(f"  {t:8.1f} s  {binary} {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
