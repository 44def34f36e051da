"""The configuration schema: every key, its type, default and meaning, in one place.

Registered in Hydra's ConfigStore as ``pita_schema``; ``pita/conf/config.yaml`` builds on it, so an
override of a key that does not exist here, or of the wrong type, is refused before anything runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from hydra.core.config_store import ConfigStore

from pita.algos import default_configs, on_register
from pita.datasets.config import DatasetConfig
from pita.models.families import FamilyConfig
from pita.plans.synthetic import ALGOS


@dataclass
class ExperimentConfig:
    name: str = "default"  # run folder: <system.output_dir>/<name>/<YYYY-MM-DD_HH-MM-SS>
    # synthetic (stand-in jobs shaped like the grid) | generate (data generation only)
    # | experiment (algorithms x datasets x rounds + base-model evaluation)
    workload: str = "experiment"
    datasets: List[str] = field(default_factory=lambda: ["arith", "sentiment"])  # names under datasets.*
    algos: List[str] = field(default_factory=lambda: ["PITA", "QSharp", "QSharp-HF", "DPO", "GRPO", "GRPO-HF"])  # settings: algos.<name>
    rounds: int = 2  # value-guided: data collection + training per round; baselines: policy rounds


@dataclass
class SystemConfig:
    devices: Any = "auto"  # auto | cpu | list of visible device indices, e.g. [0,1]
    cpu_devices: Any = "auto"  # CPU mode: logical devices (auto = min(cores, 2))
    gpu_summary_interval_s: float = 60.0  # device memory summary to run.log while the run is active
    output_dir: str = "outputs"  # runs go to <output_dir>/<experiment.name>/<time>/
    min_free_gb: float = 1.0  # refuse to start a run with less free disk under output_dir; 0 = no check
    cache_dir: str = ".cache/pita"  # models built or converted locally
    seed: int = 0  # everything: data, sampling, training, and the tiny family's weights
    attn_impl: str = "sdpa"  # sdpa | eager | flash_attention_2 (used by model-loading jobs)
    tf32: bool = True  # CUDA: TF32 matmuls in generation and training jobs
    compile: bool = False  # torch.compile the model in generation and training jobs
    clear_cache_interval: int = 0  # CUDA: empty the allocator cache every N training steps; 0 = never
    # false: one job at a time on one device (debugging; the plan and results are the same)
    use_parallel_execution: bool = True
    # lower each sampling job kind's batch (data_collection.batch_size, eval.batch_size) to the largest
    # its memory estimate fits on the smallest device; gpu=auto sets it
    fit_batches: bool = False
    # pita plan only: the devices to plan for instead of this machine's, e.g. 8x80GB, 8xH100,
    # [80GB,80GB,40GB] (GB = 10^9 bytes; a GPU name: the memory NVML reports for it)
    inventory: Any = None
    # the node's host memory (RAM) that running jobs share on a GPU node: the scheduler keeps the
    # jobs' host estimates within it, a job that alone needs more is refused (exit 2) (1TB, 512GB,
    # a number of GB); null: this machine's total memory (with system.inventory: not checked)
    host_ram: Any = None


@dataclass
class TrainingConfig:
    """Settings shared by every training job (value models, proxies, DPO / GRPO policies)."""

    # rows per forward/backward pass, gradients accumulated up to the algorithm's batch_size;
    # 0 = the whole batch at once. DPO / GRPO: the per-device batch (accumulation steps derived)
    # auto (gpu=auto): the largest that the memory estimate fits on the smallest device
    micro_batch_size: Any = 0
    # recompute activations in backward: less memory, ~30% slower; auto: only if no micro-batch fits
    gradient_checkpointing: Any = False
    # DPO / GRPO / GRPO-HF: optimizer steps between checkpoints in the job's folder (the last one
    # kept; a re-run attempt continues from it); auto: as often as keeps writing them under 5% of
    # the job's time (measured while it trains); 0: none
    save_steps: Any = "auto"


@dataclass
class RayConfig:
    address: Optional[str] = None  # auto | host:port | null (start a local instance)
    # a local instance: logical GPUs to declare (null = those Ray detects); CPU tests use e.g. 4
    num_gpus: Optional[int] = None
    num_cpus: Optional[int] = None  # a local instance: CPUs to declare (null = the machine's)
    # memory of a cluster GPU whose node has no NVML (each GPU is read on its own node where it
    # can be); null = this node's first GPU (80 if none)
    gpu_memory_gb: Optional[float] = None
    # how long start-up waits for a first GPU while every GPU of the cluster is held by other Ray
    # work (naming them every 15 s); none free by then: exit 2. GPUs that come free later join
    startup_timeout_s: float = 120.0


@dataclass
class SlurmConfig:
    # executor.backend=slurm: each job attempt is a Slurm job (sbatch) asking for the plan's GPUs,
    # CPUs, host memory and a time limit; these name where it runs
    partition: Optional[str] = None  # -p; null = the cluster's default partition
    account: Optional[str] = None  # -A
    qos: Optional[str] = None  # -q
    constraint: Optional[str] = None  # -C, e.g. a100|h100
    sbatch_args: List[str] = field(default_factory=list)  # more sbatch options, e.g. [--exclusive]
    cpus_per_job: int = 1  # CPUs per device a job holds (-c = this x its devices)
    # --time = the job's expected seconds x this; after a TIMEOUT the next attempt asks twice as
    # long (once, and never past the partition's MaxTime or the QoS's MaxWall); a second one fails
    time_margin: float = 2.0
    min_minutes: int = 10  # the shortest --time asked for
    # squeue (one call for all of this run's jobs, filtered to you) this soon after a submission
    # or a change; the interval doubles while nothing changes
    poll_interval_s: float = 5.0
    max_poll_interval_s: float = 60.0  # the longest interval between two squeue calls
    # jobs in flight (queued or running) at most; null = max_share of the partition, lowered to
    # what your association and QoS allow (sacctmgr, where accounting runs)
    max_jobs: Optional[int] = None
    # with max_jobs null: jobs in flight at most this share of the partition's usable GPUs (its
    # CPU devices on a partition without GPUs), at least 4; 1.0 = as many as the partition has
    max_share: float = 0.25
    # an attempt that ran out of host memory (OUT_OF_MEMORY) runs again with --mem times this,
    # at most oom_mem_retries times and never above the partition's largest node
    oom_mem_factor: float = 1.5
    oom_mem_retries: int = 2  # times an attempt out of host memory runs again with more --mem
    # Slurm signals an attempt this long before its time limit (--signal=B:USR1@...): a training
    # job saves a checkpoint and asks to run again from it; also the save's budget on preemption.
    # At most a quarter of the attempt's own limit; none under limits of 2 minutes (Slurm may
    # send it up to a minute early)
    signal_margin_s: int = 120
    outcome_wait_s: float = 60.0  # a job Slurm says ended: wait this long for its outcome file (NFS)
    # attempts planned shorter than this (seconds) run in packs: one Slurm job that imports torch
    # once and runs them one after another (forked), instead of a Slurm job and a fresh
    # interpreter each; 0 = every attempt is a Slurm job of its own
    pack_below_s: float = 300.0
    pack_time_s: float = 3600.0  # a pack's --time (capped at the partition's MaxTime)
    pack_idle_s: float = 60.0  # a pack with nothing to run leaves (frees its allocation) after this long
    # the partition's nodes are read again this often (one sinfo): a node that drains or goes down
    # takes its GPUs out of the inventory, one that returns brings them back
    partition_refresh_s: float = 300.0
    # a job queued longer than this is reported with Slurm's reason (and again every as long)
    pending_report_s: float = 300.0
    # --mem (GB) of a job the plan gives no host-memory estimate (always asked: a cluster without
    # DefMemPerNode gives a job that asks none the whole node's memory)
    mem_gb: float = 4.0
    # the card of the partition's GPUs (H100, A100-80GB, ...): their memory sizes the jobs; null
    # on a partition whose nodes report GPUs is exit 2 naming this key
    gpu_card: Optional[str] = None


@dataclass
class ExecutorConfig:
    backend: str = "local"  # local (a process per job) | inline (in-process, serial) | ray | slurm
    # local: forkserver (attempts fork from a warm process that imported torch, transformers and
    # TRL once; milliseconds to start) | exec (a fresh interpreter per attempt; seconds to start) |
    # auto (forkserver on CPU devices, where start-up is most of a job; exec on GPUs)
    worker_start: str = "auto"
    oom_retries: int = 2  # CUDA OOM: retry with the job's batch size halved, at most this often
    crash_retries: int = 0  # worker died (signal, exit without report): re-run this often
    # its device left (a Ray node lost): re-run elsewhere this often, not counted as a crash
    lost_retries: int = 5
    # every device gone (all Ray nodes lost) with work left: wait this long for one to join,
    # then stop as interrupted (resume_from= picks it up)
    device_wait_s: float = 600.0
    job_timeout_s: Optional[float] = None  # kill and fail a job running longer (null = no limit)
    kill_grace_s: float = 10.0  # TERM, then KILL after this many seconds
    poll_interval_s: float = 0.1  # how often the executor checks workers and starts jobs
    memory_margin: float = 0.05  # fraction of each device never reserved
    max_jobs_per_device: Optional[int] = None  # null = as many as memory allows (CPU mode: 1)
    max_cpu_jobs: Optional[int] = None  # jobs that hold no device (merges) at once; null = cores
    starvation_passes: Optional[int] = 50  # see pita/core/scheduler.py; null disables the guard
    progress: str = "auto"  # auto | rich | plain | off
    progress_interval_s: float = 30.0  # plain progress lines when not on a terminal
    max_jobs: int = 100000  # refuse a plan with more jobs (before planning when its size is known)
    # refine each job's memory estimate from the measured peaks of finished jobs of the same kind,
    # model and batch settings (max peak x 1.2 + 256 MiB; lowered after 2 jobs, back to the planned
    # estimate after an OOM on a lowered one); GPU memory on GPUs, peak RSS on CPU devices.
    # false: every job reserves its planned estimate
    learn_memory: bool = True
    # correct each job kind's expected seconds by measured / planned of finished jobs, kept in
    # <system.cache_dir>/durations.json for later plans and runs (pita/plans/durations.py)
    learn_durations: bool = True
    ray: RayConfig = field(default_factory=RayConfig)
    slurm: SlurmConfig = field(default_factory=SlurmConfig)


@dataclass
class SyntheticConfig:
    """The synthetic workload (pita/plans/synthetic.py): the real grid's shape, sleeping jobs."""

    algos: List[str] = field(default_factory=lambda: list(ALGOS))  # stand-in algorithms of the grid
    families: List[str] = field(default_factory=lambda: ["tiny"])  # model families (names only)
    datasets: List[str] = field(default_factory=lambda: ["arith", "sentiment"])  # dataset names (names only)
    rounds: int = 2  # rounds per (algorithm, family, dataset)
    gen_shards: int = 2  # generation shards per round (one per device in the real plans)
    eval_shards: int = 2  # evaluation shards per round
    job_seconds: float = 0.2  # each stand-in job sleeps this long
    memory_gb: float = 0.5  # each stand-in job's memory estimate
    # the peak each stand-in job reports (GB), what memory learning sees; null = the worker's measure
    peak_gb: Optional[float] = None
    fail: List[str] = field(default_factory=list)  # job ids that raise (to see failure handling)


@dataclass
class DataCollectionConfig:
    """Data generation (pita/generation/): sampling, scoring, preference pairs, value roll-outs."""

    recipe: str = "samples"  # samples | preference_pairs | prompts | value_rollouts (workload=generate)
    split: str = "train"  # train | test | held_out
    samples_per_prompt: int = 4  # workload=generate, samples / preference_pairs: completions per prompt
    max_new_tokens: int = 48  # completion length limit
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0  # nucleus sampling; 1 = off
    top_k: int = 0  # 0 = off
    batch_size: int = 64  # sequences generated together (halved on CUDA OOM; finished rows leave the batch)
    chunk_size: int = 64  # examples per checkpointed chunk; also the unit shards are made of
    reward_batch_size: int = 32  # reward-model scoring batch
    # math: reward = rm score + bonus * correct. 4 makes a Bradley-Terry draw (bt_beta 1) prefer a
    # correct answer to a wrong one 98% of the time (sigmoid(4)); at 1 it was 73%, too noisy for PITA
    correctness_bonus: float = 4.0
    # Bradley-Terry labels of every preference pair (PITA, the Q#-HF and GRPO-HF proxies, DPO):
    # P(a > b) = sigmoid(beta * (r_a - r_b)), drawn once per pair
    bt_beta: float = 1.0
    bradley_terry_sampling: bool = True  # false: the higher reward is always chosen
    # a pair with equal rewards, for every preference learner (PITA, DPO, the Q#-HF and GRPO-HF
    # proxies): drop (left out: it states no preference) | draw (labelled by the Bradley-Terry draw,
    # a coin flip at equal rewards, and kept). With a reward model in the reward (as the PITA
    # reference scores math: RM + correctness_bonus x correct) exact ties are rare either way
    ties: str = "drop"
    # the labelled-pair budget of every preference-learning method, per prompt and round: PITA and
    # Q#-HF pair continuations of their roll-outs, DPO and GRPO-HF sample 2x this many completions
    pairs_per_prompt: int = 4
    cut_points: int = 2  # value_rollouts: cut positions per roll-in
    continuations: int = 2  # value_rollouts: sampled continuations per cut
    continuation_mode: str = "sampled"  # sampled | greedy_vs_sampled
    memory_gb: Optional[float] = None  # per shard; null = estimated from the model's shape


@dataclass
class EvalConfig:
    """Evaluation jobs (pita/eval/): n samples per test prompt at every eta of the algorithm."""

    n: int = 8  # samples per prompt: pass@1 is their mean correctness, maj@n their majority vote
    split: str = "test"  # test | train | held_out
    max_new_tokens: int = 48  # completion length limit
    temperature: float = 1.0  # sampling temperature of every evaluated policy (and its reference)
    top_p: float = 1.0  # nucleus sampling; 1 = off
    batch_size: int = 128  # sequences generated together (halved on CUDA OOM; finished rows leave the batch)
    kl_fraction: float = 1.0  # share of the samples the KL estimate uses (stated in the results)
    # the report's headline: every method's metric at these KL(policy || reference) budgets, nats
    # per sequence, read off its own frontier of rounds and etas (pita/report/matched.py); each > 0
    kl_budgets: List[float] = field(default_factory=lambda: [0.05, 0.1, 0.25, 0.5, 1.0])
    # training prompts set aside per training dataset (its held_out split, unless
    # datasets.<name>.held_out is set): every method's rows are evaluated on them too, and each
    # round's eta and every method's frontier at equal KL are chosen on them, never on the test
    # split; at most a quarter of the training prompts; 0: no validation (eta is not chosen, the
    # equal-KL frontiers are the test envelope, labelled so)
    validation_prompts: int = 32
    # samples per validation prompt; null: eval.n. With validation_prompts, what sizes what
    # validation can tell apart (the report states it for each choice it made there); the sizing
    # rule: docs/guide.md, "Sizing validation"
    validation_n: Optional[int] = None
    # an equal-KL cell interpolated between two frontier rows more than this factor apart in KL
    # is marked "wide interpolation", with no interval; the eta search closes such gaps
    wide_ratio: float = 4.0
    # rounds of new etas the value-guided methods search on the validation prompts after each
    # round (evaluations only; pita/eval/eta_search.py) until every kl_budgets value has a row
    # within 10% or rows within wide_ratio of each other around it; the test prompts then
    # evaluate the added etas; 0: no search
    eta_search_steps: int = 3
    # the eta search's upper limit: a budget above the KL it reaches is "not reached", stopped by eval.eta_max
    eta_max: float = 64.0
    # the eta search's lower limit: a budget below the first row's KL stays a chord from base, stopped by eval.eta_min
    eta_min: float = 0.0625
    # DPO, GRPO and GRPO-HF: each round's policy is also evaluated (test and validation) at these
    # fractions of its optimizer steps, from snapshots its training job saves
    # (artifacts/snapshots/at-0.25; LoRA: the adapters alone): rows with variant "at 25%", points
    # of the frontier along training; [] for the final policy only
    checkpoints: List[float] = field(default_factory=lambda: [0.25, 0.5])
    # rows on every equal-KL frontier computed from the base model with no training
    # (pita/eval/controls.py): temperature (the base model sampled colder, its KL exact per step),
    # best_of_n (the best of n base samples by a score available at test time: the reward model
    # on reward tasks; on verifier tasks one ranked by each of the base model's log-probability per
    # token, the dataset's reward model where one is configured, the run's Q#-HF / GRPO-HF proxy
    # and Q#'s value model where they run; its KL measured from the pool, the bound
    # log n - (n-1)/n beside it) and majority_vote (verifier tasks: the answer most of n base
    # samples give, self-consistency, from the same pool); [] for none
    controls: List[str] = field(default_factory=lambda: ["temperature", "best_of_n", "majority_vote"])
    # the temperature control's first temperatures, each below eval.temperature; null: 0.85, 0.7,
    # 0.55 and 0.4 x eval.temperature. The control is then searched on the validation prompts as
    # eta is (eval.eta_search_steps rounds), down to control_temperature_min (pita/eval/eta_search.py)
    control_temperatures: Optional[List[float]] = None
    control_temperature_min: float = 0.05  # the temperature control's search goes no lower
    best_of_n: List[int] = field(default_factory=lambda: [2, 4, 8, 16])  # the best-of-n control's n (pool: 4 x max n per prompt)
    # cross-dataset evaluation: training dataset -> the datasets its models are evaluated on
    # (default: itself), e.g. {gsm8k: [gsm8k, math500]}; each needs a datasets.<name> entry
    datasets_by_train: Dict[str, List[str]] = field(default_factory=dict)


@dataclass
class GenerationConfig:
    """Shorthands for data generation, as the PITA user guide writes them."""

    batch_size: Optional[int] = None  # per-device data-generation batch; set: overrides data_collection.batch_size


@dataclass
class LoggingConfig:
    """Experiment trackers (pita/tracking.py): training metrics and the final results table."""

    # none | tensorboard (event files under <run>/tensorboard/, offline) | wandb (needs pip install
    # wandb; WANDB_MODE=offline keeps it on disk): TRL's report_to, the value-model and proxy
    # trainers' loss per step, and the final results table
    tracker: str = "none"
    project: str = "pita"  # wandb project of every run's jobs (each run's folder is its group)


@dataclass
class PitaConfig:
    experiment: ExperimentConfig = field(default_factory=ExperimentConfig)
    system: SystemConfig = field(default_factory=SystemConfig)
    executor: ExecutorConfig = field(default_factory=ExecutorConfig)
    training: TrainingConfig = field(default_factory=TrainingConfig)
    synthetic: SyntheticConfig = field(default_factory=SyntheticConfig)
    model: FamilyConfig = field(default_factory=FamilyConfig)  # group: pita/conf/model/<name>.yaml
    datasets: Dict[str, DatasetConfig] = field(default_factory=dict)  # group: pita/conf/dataset/<name>.yaml
    data_collection: DataCollectionConfig = field(default_factory=DataCollectionConfig)
    generation: GenerationConfig = field(default_factory=GenerationConfig)
    # per registered algorithm, its own typed config (pita/algos/<name>.py): a key the algorithm
    # does not have is refused
    algos: Dict[str, Any] = field(default_factory=default_configs)
    eval: EvalConfig = field(default_factory=EvalConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    resume_from: Optional[str] = None  # an earlier run folder: re-run only its unfinished jobs
    resume_force: bool = False  # resume even if overrides change the job graph


def register() -> None:
    ConfigStore.instance().store(name="pita_schema", node=PitaConfig)


register()
on_register(register)  # an algorithm registered later (a plug-in, a test) gets its algos.<name> node
