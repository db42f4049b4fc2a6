"""The visit tool's parts, each a module; generated into `tools/visit_tool.py`.

`scripts/sync_root_files.py` copies each module's code (after its snippet
mark) into the region of visit_tool.py that names it, and the whole of
`convert.py` into a string constant: the converter process's program.
"""
