"""The ONE list of differential cases that fail on this branch, each with the bug it shows.

Their tests are marked xfail(strict=True): when a fix lands the test XPASSes, the run
fails, and the entry must be removed here. Keys are case ids (tests/differential/cases_*.py);
a forced-break test is keyed "break:<case id>" (all its break points) or
"break:<case id>@<code index>:<offset>" (one).
"""

KNOWN_FAILURES: dict = {
    # ---- found by the forced-break mode (not in the bug list)
    "break:inplace_on_argument@0:44": "bugs 6/13 family: x.mul_(2) in a graph, break, x[0] = -1.0 "
                                      "eagerly: the tempa backend's write-back of the graph's "
                                      "in-place result overwrites the eager write",
}
