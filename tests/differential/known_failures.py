"""The ONE list of differential cases that fail on this branch, each with the bug it shows.

Their tests are marked xfail(strict=True): when a fix lands the test XPASSes, the run
fails, and the entry must be removed here. Keys are case ids (tests/differential/cases_*.py);
a forced-break test is keyed "break:<case id>" (all its break points) or
"break:<case id>@<code index>:<offset>" (one).
"""

KNOWN_FAILURES: dict = {
    "bug27_warnings_only_at_capture": "bug 27 (left): warnings.warn now runs every call, but at "
                                      "a break the warning is attributed to tempa/context.py, "
                                      "not the user's line",
    # ---- found by the forced-break mode (not in the bug list)
}
