"""Code the single-file tools share, written once.

`scripts/sync_root_files.py` copies each file's snippet into the regions of
the tool modules that name it; the tool modules stay self-contained.
"""
