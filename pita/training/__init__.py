"""The runtime of the TRL-trained jobs (DPO, GRPO, GRPO-HF): what the algorithms in ``pita/algos``
call to turn a training job's params into a running trainer and a saved policy.

    args = training_args(DPOConfig, p, out, cuda, tracker)        # arguments.py: TRL's config
    path, model, tok = load_policy(ctx, p, cuda)                  # models.py: weights as the job holds them
    trainer = job_trainer(DPOTrainer)(model=model, args=args, ...)  # sharding.py: FSDP2, GRPO's sampling
    result, rows = train_and_save(ctx, trainer, tok, p, "loss")   # checkpoints.py: resume, save

``arguments``  TRL / transformers / accelerate keywords: mixed precision, FSDP2, gradient
               accumulation, checkpoints, vLLM
``models``     the policy and the explicit reference as the job loads them (dtype, attention,
               ranks that read no weights)
``sharding``   the trainer class every job builds (FSDP2 on CPU ranks too, the reference sharded
               like the policy, GRPO's sampling in micro-batches), FSDP helpers
``checkpoints`` mid-training checkpoints (paced, resumed), the policy saved whole by rank 0
"""
