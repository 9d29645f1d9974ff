"""The shared foundation runs: trained once, through the run cache, and reused by the chapters.

- `msgcore.foundations.baselines`: chapter 0's Transformer baselines (Multi30k De→En and En→De), which chapter 2
  compares with and chapter 5 distils;
- `msgcore.foundations.denoiser`: the multilingual denoising model, a small stand-in for mBART, that chapters 1, 3
  and 4 fine-tune.

No chapter's experiments import another chapter's: what two chapters share lives here, or below.
"""
