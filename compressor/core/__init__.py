"""The small core every stage uses: user-facing errors (`errors`), atomic writes (`atomic`), output directories
and their locks (`outdir`), machine facts (`machine`: CPU, VNNI, caches) and timing primitives (`timing`).

May import nothing of ours: every other package imports it.
"""
