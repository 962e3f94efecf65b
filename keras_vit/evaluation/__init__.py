"""The paper's evaluations: top-1 / top-5 / per-class accuracy on any dataset, ImageNet ReaL,
ImageNet-V2 and ObjectNet by their protocols, the VTAB-1k suite, and Table 2's report.

    from keras_vit import evaluation
    result = evaluation.evaluate_classifier(model, "tfds:imagenet2012_real")
    result.metrics["top1"], result.metrics["real_top1"]
    evaluation.run_vtab(backbone, "runs/vtab")                      # 19 tasks, Table 4's setting
    print(evaluation.to_markdown(evaluation.table2(["runs/real", "runs/vtab"])))

Command line: `keras-vit evaluate`, `keras-vit vtab`, `keras-vit report` (docs/evaluation.md).
"""

from keras_vit.evaluation.evaluators import EvaluationResult, evaluate_classifier, load_for_evaluation  # noqa: F401
from keras_vit.evaluation.metrics import (  # noqa: F401
    ClassificationMetrics,
    real_top1_correct,
    top_k_correct,
    top_k_indices,
)
from keras_vit.evaluation.objectnet import (  # noqa: F401
    index_objectnet_folder,
    load_folders,
    load_mapping,
    objectnet_dataset,
    objectnet_scores,
)
from keras_vit.evaluation.report import PAPER_TABLE2, ROWS, table2, to_csv, to_markdown  # noqa: F401
from keras_vit.evaluation.vtab import GROUPS, VTAB_1K, VtabSetting, resolve_tasks, run_vtab, summarise  # noqa: F401
