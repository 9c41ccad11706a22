# Blocks added until the first screen is decided (`design.blocks: auto`; servesweep/adaptive.py, docs/measurement.md
# "Adding blocks until the first screen is decided"): look `look` gathers every config's launches of its blocks,
# decides the sweep at the look's level and says whether the next look's blocks are measured (rules/common.smk,
# final_look).
checkpoint decide_look:
    input:
        cells=get_look_launches("cells.csv"),
        repeats=get_look_launches("repeats.csv"),
        meta=get_look_launches("meta.json"),
    output:
        folder=directory("results/design/look{look}"),
    log:
        "logs/design/look{look}.log",
    conda:
        "../envs/servesweep.yaml"
    params:
        baseline=BASELINE,
        cost=config["cost"],
        decision=config["decision"],
        looks=[look.blocks for look in LOOKS],
        budget_min=config["design"]["budget_min"],
    script:
        "../scripts/decide_look.py"
