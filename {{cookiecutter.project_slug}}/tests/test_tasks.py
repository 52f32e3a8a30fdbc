"""Fast in-process tests of the task types (sentence pairs, single-label, multi-label, regression) and
predict.py. No torchrun: the model and tokenizer are the tiny offline ones from smoke.py, data is built in
memory or written into tmp_path."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import PACKAGE, REQUIRED, in_memory, names_from, package_module, parse_args
from datasets import ClassLabel, Dataset, DatasetDict, Features, List, Value
from scipy.special import expit, softmax
from scipy.stats import pearsonr, spearmanr
from transformers import AutoConfig

ConfigError, DataArguments, ModelArguments = names_from("config", "ConfigError", "DataArguments", "ModelArguments")
Task, decide_task, label_names, load_raw_datasets, tokenize_datasets = names_from(
    "data", "Task", "decide_task", "label_names", "load_raw_datasets", "tokenize_datasets"
)
multi_label_metrics, predict_from_logits, regression_metrics, task_metrics = names_from(
    "metrics", "multi_label_metrics", "predict_from_logits", "regression_metrics", "task_metrics"
)
load_model = package_module("modeling").load_model
predict_file, prediction_columns, write_rows = names_from("predict", "predict_file", "prediction_columns", "write_rows")
smoke = package_module("smoke")

SINGLE, MULTI, REGRESSION = "single_label_classification", "multi_label_classification", "regression"


pytestmark = pytest.mark.usefixtures("isolated_process", "datasets_cache_in_tmp_path")  # predict reads files


def data_args(**options) -> object:
    return DataArguments(train_file="train.jsonl", **options)


def words(count: int, word: str = "movie") -> str:
    return " ".join([word] * count)


# ---- config: the new data flags ----------------------------------------------------------------

@pytest.mark.parametrize(("options", "message"), [
    (dict(text_pair_column="text"), "^--text_pair_column text: use a column other than the text and label columns$"),
    (dict(text_pair_column="label"), "^--text_pair_column label: use a column other than the text and label"),
    (dict(multi_label_threshold=0.0), r"^--multi_label_threshold 0.0: must be between 0 and 1$"),
    (dict(multi_label_threshold=1.0), r"^--multi_label_threshold 1.0: must be between 0 and 1$"),
    (dict(test_file="rows.txt"), r"^--test_file 'rows.txt': unsupported format; use .csv, .json, .jsonl or .parquet$"),
], ids=["pair-is-text", "pair-is-label", "threshold-0", "threshold-1", "test-suffix"])
def test_new_data_arguments_refuse_bad_settings(options: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        data_args(**options)


def test_new_data_flags_land_default_to_auto_detection_and_do_predict_needs_a_test_file() -> None:
    _, defaults, _ = parse_args(REQUIRED)
    assert (defaults.problem_type, defaults.text_pair_column, defaults.label_delimiter) == ("auto", None, None)
    assert (defaults.multi_label_threshold, defaults.test_file) == (0.5, None)
    _, parsed, training_args = parse_args([
        *REQUIRED, "--text_pair_column", "sentence2", "--problem_type", MULTI, "--label_delimiter", ";",
        "--multi_label_threshold", "0.3", "--test_file", "rows.csv", "--do_predict", "true"])
    assert (parsed.text_pair_column, parsed.problem_type, parsed.label_delimiter) == ("sentence2", MULTI, ";")
    assert (parsed.multi_label_threshold, parsed.test_file, training_args.do_predict) == (0.3, "rows.csv", True)
    with pytest.raises(ConfigError, match="^--do_predict needs --test_file: the csv, json, jsonl or parquet rows"):
        parse_args([*REQUIRED, "--do_predict", "true"])


# ---- data: deciding the task -------------------------------------------------------------------

@pytest.mark.parametrize(("train_labels", "validation_labels", "options", "problem_type", "names"), [
    ([0.5, 2.0, 4.25], [1.0], {}, REGRESSION, []),
    ([["sports"], ["food", "sports"], []], [["food"]], {}, MULTI, ["food", "sports"]),
    (["sports", "food | sports", ""], ["food"], dict(label_delimiter="|"), MULTI, ["food", "sports"]),
    (["pos", "neg", "pos"], ["neg"], {}, SINGLE, ["neg", "pos"]),
    ([10, 2, 10], [2], {}, SINGLE, ["2", "10"]),  # whole numbers are classes unless asked for regression
], ids=["floats", "lists", "delimiter", "strings", "ints"])
def test_auto_problem_type_follows_what_the_label_column_holds(
    train_labels: list, validation_labels: list, options: dict, problem_type: str, names: list[str]
) -> None:
    task = decide_task(in_memory(train_labels, validation_labels), data_args(**options))
    assert (task.problem_type, task.label_names) == (problem_type, names)
    assert task.num_labels == (1 if problem_type == REGRESSION else len(names))


def test_decide_task_carries_the_flags_caps_max_seq_length_and_needs_numbers_for_regression() -> None:
    task = decide_task(in_memory([1, 3, 2], [2]), data_args(problem_type=REGRESSION))
    assert (task.problem_type, task.label_names, task.num_labels) == (REGRESSION, [], 1)
    with pytest.raises(ConfigError, match=r"^--problem_type regression needs numbers in --label_column label; "
                                          r"it holds Value\('string'\)$"):
        decide_task(in_memory(["1.5", "2"], ["2"]), data_args(problem_type=REGRESSION))
    raw = in_memory(["a", "b"], ["a"])
    for split in raw:
        raw[split] = raw[split].add_column("second", ["fine"] * len(raw[split]))
    options = dict(text_pair_column="second", multi_label_threshold=0.3, max_seq_length=512)
    assert decide_task(raw, data_args(**options), model_max_length=128) == Task(
        SINGLE, ["a", "b"], "text", "second", "label", None, 128, 0.3)
    assert decide_task(raw, data_args(**options), model_max_length=None).max_seq_length == 512
    assert decide_task(raw, data_args(max_seq_length=64), model_max_length=128).max_seq_length == 64


def test_multi_label_names_refuse_unseen_or_no_labels_keep_class_label_order() -> None:
    raw = in_memory(["a|b", "b"], ["a|zebra", "yak"])
    with pytest.raises(ConfigError, match=r"validation has labels not seen in train: \['yak', 'zebra'\]"):
        label_names(raw, "label", MULTI, "|")
    with pytest.raises(ConfigError, match="holds no labels in the train split"):
        label_names(in_memory([[], []], [[]], Features(text=Value("string"), label=List(Value("string")))),
                    "label", MULTI)
    # Lists of ClassLabels keep their names' order and encode multi-hot.
    features = Features(text=Value("string"), label=List(ClassLabel(names=["sports", "food", "music"])))
    raw = in_memory([[0, 2], [], [1]], [[2, 1]], features=features)
    task = decide_task(raw, data_args())
    assert (task.problem_type, task.label_names) == (MULTI, ["sports", "food", "music"])
    data = tokenize_datasets(raw, smoke.build_tokenizer(), task)
    assert data["train"]["labels"] == [[1.0, 0.0, 1.0], [0.0, 0.0, 0.0], [0.0, 1.0, 0.0]]
    assert data["validation"]["labels"] == [[0.0, 1.0, 1.0]]


# ---- data: tokenising pairs and encoding labels -------------------------------------------------

def pairs(first: list[str], second: list[str], split: str = "train") -> DatasetDict:
    return DatasetDict({split: Dataset.from_dict(dict(text=first, second=second, label=["a"] * len(first)))})


def pair_task(max_seq_length: int = 512, problem_type: str = SINGLE, names: tuple = ("a",)) -> object:
    return Task(problem_type, list(names), text_pair_column="second", max_seq_length=max_seq_length)


def test_pairs_get_segment_ids_and_truncation_cuts_the_longer_text_first() -> None:
    tokenizer = smoke.build_tokenizer()
    data = tokenize_datasets(pairs(["good movie", "bad"], ["great fun film", "dull plot"]), tokenizer, pair_task())
    first = data["train"][0]
    assert tokenizer.convert_ids_to_tokens(first["input_ids"]) == [
        "[CLS]", "good", "movie", "[SEP]", "great", "fun", "film", "[SEP]"]
    assert first["token_type_ids"] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert data["train"][1]["token_type_ids"] == [0, 0, 0, 1, 1, 1]
    assert data["train"]["length"] == [8, 6]
    assert data["train"]["truncated"] == [False, False]
    first = [words(12), "good", words(2), words(3)]
    second = ["fun", words(12, "film"), "fun", "fun"]
    data = tokenize_datasets(pairs(first, second), tokenizer, pair_task(max_seq_length=8))["train"]
    segments = [[sum(1 for t in types if t == s) for s in (0, 1)] for types in data["token_type_ids"]]
    # [CLS] first [SEP] | second [SEP]: 5 text tokens fit; the longer text gives way until they do.
    assert segments == [[6, 2], [3, 5], [4, 2], [5, 2]]
    assert data["length"] == [8, 8, 6, 7]
    assert data["truncated"] == [True, True, False, False]
    exact = tokenize_datasets(pairs([words(3)], ["fun"]), tokenizer, pair_task(max_seq_length=7))["train"]
    assert (exact["length"], exact["truncated"]) == ([7], [False])  # fits exactly: not cut


def test_labels_are_encoded_per_problem_type_only_in_train_and_validation() -> None:
    tokenizer = smoke.build_tokenizer()
    floats = tokenize_datasets(in_memory([0.5, 4.25], [3.0]), tokenizer, Task(REGRESSION, []))
    assert floats["train"]["labels"] == [0.5, 4.25]
    assert floats["train"].features["labels"] == Value("float64")  # MSE loss takes floats
    ints = tokenize_datasets(in_memory([1, 3], [2]), tokenizer, Task(REGRESSION, []))
    assert ints["validation"]["labels"] == [2.0]
    assert ints["validation"].features["labels"] == Value("float64")
    delimited = Task(MULTI, ["food", "music", "sports"], label_delimiter="|")
    multi_hot = tokenize_datasets(in_memory(["sports | food", "", "music"], ["food"]), tokenizer, delimited)
    assert multi_hot["train"]["labels"] == [[1.0, 0.0, 1.0], [0.0, 0.0, 0.0], [0.0, 1.0, 0.0]]
    assert multi_hot["train"].features["labels"] == List(Value("float64"))  # BCE loss takes float rows
    raw = in_memory(["a", "b"], ["a"])
    raw["test"] = raw["validation"]  # a test file with labels: predicted, not scored
    data = tokenize_datasets(raw, tokenizer, Task(SINGLE, ["a", "b"]))
    assert "labels" in data["train"].column_names and "labels" in data["validation"].column_names
    assert sorted(data["test"].column_names) == ["attention_mask", "input_ids", "length", "token_type_ids", "truncated"]


@pytest.mark.parametrize(("column", "value"), [("text", ""), ("text", "   "), ("text", None), ("second", None)])
def test_a_row_without_text_is_refused_naming_the_row_and_the_column(column: str, value: str | None) -> None:
    first, second = ["good"] * 5, ["fun"] * 5
    (first if column == "text" else second)[3] = value
    with pytest.raises(ConfigError, match=f"^row 3 of the validation data \\(0-based\\) has no text in "
                                          f"column '{column}'$"):
        tokenize_datasets(pairs(first, second, split="validation"), smoke.build_tokenizer(), pair_task())


def test_an_empty_row_is_named_by_its_index_in_the_split_not_in_its_batch() -> None:
    texts = ["good"] * 1200
    texts[1100] = ""  # in the second batch of 1000 that map hands encode
    with pytest.raises(ConfigError, match=r"^row 1100 of the train data \(0-based\)"):
        tokenize_datasets(pairs(texts, ["fun"] * 1200), smoke.build_tokenizer(), pair_task())


# ---- data: loading a test file and a pair column -----------------------------------------------

def write_jsonl(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def test_a_test_split_needs_no_labels_but_needs_the_pair_column(tmp_path: Path) -> None:
    labelled = [dict(text=f"good {i}", second="fun", label="a") for i in range(6)]
    train = write_jsonl(tmp_path / "train.jsonl", labelled)
    validation = write_jsonl(tmp_path / "validation.jsonl", labelled[:2])
    test = write_jsonl(tmp_path / "test.jsonl", [dict(text="bad", second="dull"), dict(text="ok", second="ok")])
    raw = load_raw_datasets(DataArguments(train_file=train, validation_file=validation, test_file=test,
                                          text_pair_column="second"), cache_dir=str(tmp_path / "cache"))
    assert list(raw) == ["train", "validation", "test"]
    assert raw["test"].column_names == ["text", "second"]
    assert raw["test"]["text"] == ["bad", "ok"]
    assert len(raw["train"]) == 6
    unpaired = write_jsonl(tmp_path / "unpaired.jsonl", [dict(text="bad")])
    with pytest.raises(ConfigError, match="^--text_pair_column 'second' is not a column of the test split; "
                                          "columns are: text$"):
        load_raw_datasets(DataArguments(train_file=train, test_file=unpaired, text_pair_column="second"),
                          cache_dir=str(tmp_path / "cache"))
    with pytest.raises(ConfigError, match="^--text_pair_column 'sentence2' is not a column of the train split; "
                                          "columns are: text, second, label$"):
        load_raw_datasets(DataArguments(train_file=train, text_pair_column="sentence2"),
                          cache_dir=str(tmp_path / "cache"))


# ---- metrics -----------------------------------------------------------------------------------

def test_predict_from_logits_and_task_metrics_give_each_problem_types_figures() -> None:
    logits = np.array([[2.0, 0.0, -1.0], [0.0, 3.0, 0.5]])
    predictions, scores = predict_from_logits(logits, SINGLE)
    assert predictions.tolist() == [0, 1]
    np.testing.assert_allclose(scores, softmax(logits, axis=1).max(axis=1))
    multi = np.array([[2.0, -2.0, 0.0], [0.5, 1.0, -0.1]])
    predictions, scores = predict_from_logits(multi, MULTI)
    assert predictions.tolist() == [[1, 0, 0], [1, 1, 0]]  # sigmoid(0) = 0.5 is not above 0.5
    np.testing.assert_allclose(scores, expit(multi))
    assert predict_from_logits(multi, MULTI, threshold=0.7)[0].tolist() == [[1, 0, 0], [0, 1, 0]]
    values, scores = predict_from_logits(np.array([[1.5], [-0.25]]), REGRESSION)
    assert values.tolist() == scores.tolist() == [1.5, -0.25]
    single = task_metrics(np.array([[2.0, 0.0], [0.0, 1.0], [3.0, 0.0]]), np.array([0, 1, 1]), SINGLE, ["x", "y"])
    assert single["accuracy"] == pytest.approx(2 / 3)
    assert single["confusion_matrix"] == [[1, 0], [1, 1]]
    logits, labels = np.array([[1.0, -1.0], [-1.0, 0.5]]), np.array([[1.0, 0.0], [0.0, 1.0]])
    assert task_metrics(logits, labels, MULTI, ["x", "y"])["subset_accuracy"] == 1.0
    # sigmoid(0.5) = 0.62: below a threshold of 0.7 the second row loses its label.
    assert task_metrics(logits, labels, MULTI, ["x", "y"], threshold=0.7)["subset_accuracy"] == 0.5
    regression = task_metrics(np.array([[1.0], [2.0], [3.0]]), np.array([1.0, 2.0, 4.0]), REGRESSION, [])
    assert regression["mse"] == pytest.approx(1 / 3)
    assert regression["pearson"] == pytest.approx(pearsonr([1.0, 2.0, 3.0], [1.0, 2.0, 4.0])[0])


def test_regression_metrics_match_numpy_scipy_and_a_hand_computed_example() -> None:
    predictions, labels = np.array([1.0, 2.5, 2.0, 4.0, 3.0]), np.array([1.0, 2.0, 3.0, 4.0, 5.0])
    metrics = regression_metrics(predictions, labels)
    # errors 0, 0.5, -1, 0, -2; prediction ranks 1 3 2 5 4, so Spearman = 1 - 6 * 4 / (5 * 24).
    assert metrics == {"mse": pytest.approx(1.05), "mae": pytest.approx(0.7), "pearson": pytest.approx(
        pearsonr(predictions, labels)[0]), "spearman": pytest.approx(0.8), "num_examples": 5}
    assert metrics["mse"] == pytest.approx(np.mean((predictions - labels) ** 2))
    assert metrics["spearman"] == pytest.approx(spearmanr(predictions, labels)[0])
    assert regression_metrics(predictions.reshape(-1, 1), labels)["pearson"] == pytest.approx(metrics["pearson"])
    assert json.loads(json.dumps(metrics)) == metrics


@pytest.mark.parametrize(("predictions", "labels"), [
    ([1.0, 2.0, 3.0], [2.0, 2.0, 2.0]),  # constant labels
    ([2.0, 2.0, 2.0], [1.0, 2.0, 3.0]),  # constant predictions (a collapsed head)
    ([1.5], [2.0]),  # one example
    ([], []),  # no examples
], ids=["constant-labels", "constant-predictions", "one", "none"])
def test_degenerate_regression_inputs_give_zero_correlations_not_nan(predictions: list, labels: list) -> None:
    metrics = regression_metrics(np.array(predictions), np.array(labels))
    assert (metrics["pearson"], metrics["spearman"]) == (0.0, 0.0)
    errors = np.array(predictions) - np.array(labels)
    assert metrics["mse"] == pytest.approx(float(np.mean(errors**2)) if len(errors) else 0.0)
    assert metrics["num_examples"] == len(labels)
    assert not any(isinstance(value, float) and math.isnan(value) for value in metrics.values())


def test_multi_label_metrics_match_by_hand_and_handle_empty_or_negative_rows() -> None:
    labels = np.array([[1, 0, 1, 0], [0, 1, 0, 0], [1, 1, 0, 0]])
    predictions = np.array([[1, 0, 0, 0], [0, 1, 0, 0], [1, 0, 1, 0]])
    metrics = multi_label_metrics(predictions, labels, ["a", "b", "c", "d"])
    # Only row 1 is wholly right. Hits 2 + 1 + 0 of 4 predicted and 5 actual: micro-F1 6/9. Per label
    # F1 a 1, b 2/3, c 0; d appears nowhere and does not count: macro-F1 (1 + 2/3 + 0) / 3.
    assert metrics["subset_accuracy"] == pytest.approx(1 / 3)
    assert metrics["f1_micro"] == pytest.approx(2 / 3)
    assert metrics["f1_macro"] == pytest.approx(5 / 9)
    assert metrics["num_examples"] == 3
    assert metrics["per_class"] == {
        "a": {"precision": 1.0, "recall": 1.0, "f1": 1.0, "support": 2},
        "b": {"precision": 1.0, "recall": 0.5, "f1": pytest.approx(2 / 3), "support": 2},
        "c": {"precision": 0.0, "recall": 0.0, "f1": 0.0, "support": 1},
        "d": {"precision": 0.0, "recall": 0.0, "f1": 0.0, "support": 0},
    }
    assert json.loads(json.dumps(metrics)) == metrics  # plain types: metrics.json takes them as they are
    empty = multi_label_metrics(np.zeros((0, 2)), np.zeros((0, 2)), ["a", "b"])
    assert (empty["subset_accuracy"], empty["f1_micro"], empty["f1_macro"], empty["num_examples"]) == (0, 0, 0, 0)
    negatives = multi_label_metrics(np.zeros((2, 2)), np.zeros((2, 2)), ["a", "b"])
    assert negatives["subset_accuracy"] == 1.0  # predicting "no label" for a row with none is right
    assert (negatives["f1_micro"], negatives["f1_macro"]) == (0.0, 0.0)


# ---- modeling: the task in the model's config ---------------------------------------------------

TASKS = {
    "single": Task(SINGLE, ["different", "same"], "sentence1", "sentence2", max_seq_length=64),
    "multi": Task(MULTI, ["sports", "food", "music"], label_column="labels", label_delimiter="|",
                  max_seq_length=32, multi_label_threshold=0.3),
    "regression": Task(REGRESSION, [], max_seq_length=128),
}


def tiny_model(assets: Path, task: object) -> torch.nn.Module:
    return load_model(ModelArguments(model_name_or_path=str(assets / "tiny-bert"), ignore_mismatched_sizes=True),
                      task)


def test_load_model_records_the_task_and_gives_regression_one_output(smoke_assets: Path) -> None:
    model = tiny_model(smoke_assets, TASKS["multi"])
    config = model.config
    assert (config.problem_type, config.num_labels, model.classifier.out_features) == (MULTI, 3, 3)
    assert config.id2label == {0: "sports", 1: "food", 2: "music"}
    assert config.label2id == {"sports": 0, "food": 1, "music": 2}
    assert config.classification_inputs == {
        "text_column": "text", "text_pair_column": None, "label_column": "labels", "label_delimiter": "|",
        "max_seq_length": 32, "multi_label_threshold": 0.3}
    model = tiny_model(smoke_assets, TASKS["regression"])
    assert (model.config.problem_type, model.config.num_labels, model.classifier.out_features) == (REGRESSION, 1, 1)
    batch = smoke.build_tokenizer()(["good movie", "bad"], padding=True, return_tensors="pt")
    assert model(**batch).logits.shape == (2, 1)
    config = AutoConfig.from_pretrained(smoke_assets / "tiny-bert")  # a checkpoint saved without a task
    assert Task.from_config(config) == Task(SINGLE, ["LABEL_0", "LABEL_1"])  # single-label, default inputs


@pytest.mark.parametrize("name", TASKS)
def test_a_saved_model_gives_back_its_task(smoke_assets: Path, tmp_path: Path, name: str) -> None:
    tiny_model(smoke_assets, TASKS[name]).save_pretrained(tmp_path / "model")
    assert Task.from_config(AutoConfig.from_pretrained(tmp_path / "model")) == TASKS[name]


# ---- predict: columns and files ----------------------------------------------------------------

def test_prediction_columns_for_each_problem_type() -> None:
    logits = np.array([[2.0, 0.0, -1.0], [0.0, 3.0, 0.5]])
    single = prediction_columns(logits, Task(SINGLE, ["x", "y", "z"]))
    assert list(single) == ["prediction", "score"]
    assert single["prediction"] == ["x", "y"]
    assert single["score"] == pytest.approx(softmax(logits, axis=1).max(axis=1).tolist())
    multi = prediction_columns(np.array([[2.0, -2.0, 0.1], [-1.0, -1.0, -1.0]]),
                               Task(MULTI, ["x", "y", "z"], multi_label_threshold=0.5))
    assert list(multi) == ["prediction", "score_x", "score_y", "score_z"]
    assert multi["prediction"] == [["x", "z"], []]
    assert multi["score_x"] == pytest.approx([expit(2.0), expit(-1.0)])
    stricter = prediction_columns(np.array([[2.0, -2.0, 0.1]]), Task(MULTI, ["x", "y", "z"], multi_label_threshold=0.8))
    assert stricter["prediction"] == [["x"]]
    assert prediction_columns(np.array([[1.5], [-0.25]]), Task(REGRESSION, [])) == {"prediction": [1.5, -0.25]}


def multi_label_rows() -> tuple[Dataset, dict[str, list]]:
    rows = Dataset.from_dict(dict(id=[7, 3, 5], text=["football and pasta", "nothing", "a song"]))
    columns = {"prediction": [["food", "sports"], [], ["music"]], "score_food": [0.9, 0.1, 0.2],
               "score_music": [0.3, 0.2, 0.8], "score_sports": [0.7, 0.4, 0.1]}
    return rows, columns


def read_back(path: Path) -> pd.DataFrame:
    if path.suffix == ".csv":
        return pd.read_csv(path, keep_default_na=False)  # an empty label set stays ""
    if path.suffix == ".parquet":
        return pd.read_parquet(path)
    if path.suffix == ".json":
        assert isinstance(json.loads(path.read_text()), list), "a .json file holds one array"
    return pd.read_json(path, lines=path.suffix == ".jsonl")


@pytest.mark.parametrize("suffix", [".csv", ".json", ".jsonl", ".parquet"])
def test_write_rows_keeps_row_order_and_puts_predictions_after_the_input_columns(tmp_path: Path, suffix: str) -> None:
    rows, columns = multi_label_rows()
    path = write_rows(rows, columns, str(tmp_path / "new" / f"predictions{suffix}"))
    assert path == tmp_path / "new" / f"predictions{suffix}"
    frame = read_back(path)
    assert list(frame.columns) == ["id", "text", "prediction", "score_food", "score_music", "score_sports"]
    assert frame["id"].tolist() == [7, 3, 5]
    assert frame["text"].tolist() == rows["text"]
    assert frame["score_music"].tolist() == pytest.approx([0.3, 0.2, 0.8])
    label_sets = [list(value) for value in frame["prediction"]] if suffix != ".csv" else frame["prediction"].tolist()
    assert label_sets == (["food|sports", "", "music"] if suffix == ".csv" else columns["prediction"])


def test_write_rows_writes_one_json_array_and_refuses_a_prediction_column(tmp_path: Path) -> None:
    rows = Dataset.from_dict({"text": [f"review {i}" for i in range(1001)]})  # datasets writes 1000 per batch
    path = write_rows(rows, {"prediction": ["good"] * 1001}, str(tmp_path / "predictions.json"))
    written = json.loads(path.read_text())
    assert [row["text"] for row in written] == rows["text"] and written[-1]["prediction"] == "good"
    rows = Dataset.from_dict(dict(text=["good", "bad"], prediction=["x", "y"]))
    with pytest.raises(ConfigError, match=r"^--input_file already has column\(s\) prediction, which the "
                                          r"predictions would replace: rename them$"):
        write_rows(rows, {"prediction": ["a", "b"], "score": [0.9, 0.8]}, str(tmp_path / "out.csv"))
    assert not (tmp_path / "out.csv").exists()


# ---- predict: end to end on one process --------------------------------------------------------

def test_predict_file_predicts_every_row_in_input_order_as_the_model_does_one_by_one(
    smoke_assets: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    task = Task(SINGLE, ["different", "same"], "sentence1", "sentence2", max_seq_length=16)
    model = tiny_model(smoke_assets, task)
    model.train()  # as a training loop leaves it: predictions must not draw dropout
    tokenizer = smoke.build_tokenizer()
    rows = [dict(id=i, sentence1=words(length, "good"), sentence2="dull plot")
            for i, length in enumerate([2, 30, 1, 5, 3])]  # 30 words: longer than max_seq_length
    input_file = write_jsonl(tmp_path / "rows.jsonl", rows)
    with caplog.at_level(logging.INFO, logger=f"{PACKAGE}.data"):
        path = predict_file(model, tokenizer, task, input_file, str(tmp_path / "out.jsonl"), batch_size=2,
                            device=torch.device("cpu"))
    assert "input: 1 of 5 inputs were longer than max_seq_length 16 and were truncated" in caplog.messages
    written = [json.loads(line) for line in path.read_text().splitlines()]
    assert [list(row) for row in written] == [["id", "sentence1", "sentence2", "prediction", "score"]] * 5
    assert [row["id"] for row in written] == [0, 1, 2, 3, 4]
    with torch.no_grad():
        for row, out in zip(rows, written, strict=True):
            one = tokenizer(row["sentence1"], row["sentence2"], truncation=True, max_length=16, return_tensors="pt")
            probabilities = softmax(model(**one).logits.numpy()[0])
            assert out["prediction"] == task.label_names[int(probabilities.argmax())]
            assert out["score"] == pytest.approx(float(probabilities.max()), abs=1e-5)
    assert len({round(row["score"], 6) for row in written}) == 5  # distinct rows: a mixed-up order would show


@pytest.mark.parametrize(("pair_column", "rows", "message"), [
    (None, None, "^--input_file '{input_file}' not found$"),
    (None, [dict(text="good"), dict(text="fun"), dict(text="")],
     r"^row 2 of the input data \(0-based\) has no text in column 'text'$"),
    ("second", [dict(text="good", label="same")],
     "^--text_pair_column 'second' is not a column of {input_file}; columns are: text, label$"),
], ids=["missing-file", "row-without-text", "input-without-the-pair-column"])
def test_predict_file_refuses_a_missing_file_a_row_without_text_or_no_pair_column(
    smoke_assets: Path, tmp_path: Path, pair_column: str | None, rows: list[dict], message: str
) -> None:
    task = Task(SINGLE, ["different", "same"], text_pair_column=pair_column)
    input_file = write_jsonl(tmp_path / "rows.jsonl", rows) if rows else str(tmp_path / "rows.jsonl")
    with pytest.raises(ConfigError, match=message.format(input_file=input_file)):
        predict_file(tiny_model(smoke_assets, task), smoke.build_tokenizer(), task, input_file,
                     str(tmp_path / "out.csv"), batch_size=4, device=torch.device("cpu"))
    assert not (tmp_path / "out.csv").exists()
