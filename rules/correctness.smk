rule check_lossless:
    input:
        coding_eval=get_run_outputs("coding_eval.json"),
        greedy=get_run_outputs("greedy.jsonl"),
        meta=get_run_outputs("meta.json"),
    output:
        csv=report_table("correctness"),
        md="results/tables/correctness.md",
    log:
        "logs/correctness/check_lossless.log",
    conda:
        "../envs/servesweep.yaml"
    params:
        baseline=BASELINE,
    script:
        "../scripts/check_lossless.py"
