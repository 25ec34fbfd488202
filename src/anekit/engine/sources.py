"""Short names of the public sources the engine layer cites, expanded in every evidence record.

Hardware-run projects and measurements first (DESIGN.md "Evidence"), then reports, then the project's
reference documents.
"""

GUIDE = "sbryngelson/ane-guide"  # the book "Apple Neural Engine: Architecture, Programming, and Performance"
GUIDE_SURFACE = f"{GUIDE} part-1-machine/04-capability-surface.md"
GUIDE_RULES = f"{GUIDE} part-5-practice/17-model-design-rules.md"
GUIDE_PITFALLS = f"{GUIDE} part-5-practice/19-pitfalls-and-limits.md"
GUIDE_MATRIX = f"{GUIDE} appendices/a-op-device-matrix.md"
GUIDE_CROSS_CHIP = f"{GUIDE} part-3-performance/12-cross-chip.md"
FORGE = "sbryngelson/ANEForge"
ORION = "mechramc/Orion docs/ane_constraints.md"
MADERIX = "maderix/ANE"
MADERIX_REPORT = "maderix/ANE benchmarks/ANE_BENCHMARK_REPORT.md"
MADERIX_COMMUNITY = "maderix/ANE benchmarks/community_results.json"
RUSTANE = "ncdrone/rustane README.md, 'ANE Gotchas'"
M0AT = "m0at/ANEtransformers"
ESPRESSO = "christopherkarani/Espresso"
HOLLANCE_44 = "hollance/neural-engine issue #44"
RANE = "reference rane-api.md, 'MIL operations'"
LAWS = "reference ane-empirical-laws.md"
