"""``alma build``: plan (offline), preflight, then kas + bitbake with live progress and a summary."""
