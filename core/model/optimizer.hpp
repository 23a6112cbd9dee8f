// The optimizer configuration: one type and one vocabulary from the experiment YAML through the
// plan (PlanSettings) into every executor and the single-device reference. Names and defaults
// follow torch.optim.Muon and torch.optim.AdamW where they have them; README.md ("Optimizer")
// lists where muonbed differs and why:
//
//   torch.optim.Muon(lr=1e-3, weight_decay=0.1, momentum=0.95, nesterov=True,
//                    ns_coefficients=(3.4445, -4.775, 2.0315), eps=1e-7, ns_steps=5,
//                    adjust_lr_fn=None)                       # None means "original"
//   torch.optim.AdamW(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
//
// muonbed adds: momentum_form (torch's code is the lerp form; "classic" is the textbook
// buf = beta * buf + g), named coefficient sets and per-step lists (Polar Express), "none" as an
// adjust_lr_fn, QK-clip (MuonClip, Kimi K2), and comm_dtype, the dtype of everything moved between
// ranks (the reference rounds to it at the same places, so distributed and single-device steps
// agree bit for bit).
//
// Plain C++17 and header-only apart from the string conversions: the CUDA sources include it.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/model/model.hpp"

namespace muonbed {

enum class MomentumForm {
  classic,  // buf = beta * buf + g;          Nesterov direction: g + beta * buf
  lerp,     // buf = lerp(buf, g, 1 - beta);  Nesterov direction: lerp(g, buf, beta)
            // (torch.optim.Muon's and Keller Jordan's code: an EMA, 1 - beta times smaller)
};
std::string_view to_string(MomentumForm form);
MomentumForm momentum_form_from_string(std::string_view text);  // throws Error listing names

// Muon's per-matrix learning-rate multiplier (torch.optim.Muon's adjust_lr_fn).
enum class LrScaleRule {
  none,             // 1
  original,         // sqrt(max(1, rows / cols))          (Keller Jordan's Muon, torch's default)
  match_rms_adamw,  // 0.2 * sqrt(max(rows, cols))        (Moonlight: update RMS like AdamW's)
};
std::string_view to_string(LrScaleRule rule);
LrScaleRule lr_scale_rule_from_string(std::string_view text);  // throws Error listing names

// One Newton-Schulz step's quintic: X <- a X + b (X X^T) X + c (X X^T)^2 X.
struct NsStepCoefficients {
  double a = 0.0, b = 0.0, c = 0.0;
  bool operator==(const NsStepCoefficients& o) const { return a == o.a && b == o.b && c == o.c; }
};

struct MuonConfig {
  double lr = 1e-3;
  double weight_decay = 0.1;  // decoupled: p *= 1 - lr * weight_decay
  double momentum = 0.95;
  bool nesterov = true;
  MomentumForm momentum_form = MomentumForm::lerp;
  // "keller" (alias "keller_jordan", torch's default), "polar_express", or "custom" with one
  // entry per step in custom_coefficients (a single torch-style (a, b, c) is repeated ns_steps
  // times when read from YAML).
  std::string ns_coefficients = "keller";
  std::vector<NsStepCoefficients> custom_coefficients;
  double eps = 1e-7;  // X0 = G / (||G||_F + eps)
  int ns_steps = 5;
  LrScaleRule adjust_lr_fn = LrScaleRule::original;
};

struct AdamWConfig {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.01;
};

// MuonClip: after the update, the query and key rows of every head whose largest attention logit
// S exceeded tau are scaled by sqrt(tau / S). The testbed makes the logits up (seeded), so every
// executor and the reference see the same ones.
struct QkClipConfig {
  bool enabled = false;
  double tau = 100.0;
  std::int64_t head_dim = 0;  // rows per attention head of attn_q / attn_k (the Model has none)
};

struct OptimizerConfig {
  MuonConfig muon;
  AdamWConfig adamw;
  QkClipConfig qk_clip;
  DType comm_dtype = DType::bf16;  // updates moved between ranks (and the NS input/output)
};

// Throws Error naming the field and the valid range when the config cannot run (non-finite or
// negative rates, betas outside [0, 1), custom coefficients that do not match ns_steps, ...).
void validate(const OptimizerConfig& config);

}  // namespace muonbed
