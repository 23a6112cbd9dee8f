// The hand-countable one-layer model of the training-step tests (tests/core/training_test.cpp,
// tests/core/program_training_test.cpp): hidden 8, four 8 x 8 attention projections, an MLP of 32,
// a vocabulary of 16 (embedding and LM head), bf16, laid out on the given mesh dims.
#pragma once

#include <vector>

#include "core/model/parallelize.hpp"

namespace muonbed::testing {

inline ShardedModel hand_training_model(const std::vector<MeshDim>& dims) {
  Model model;
  model.name = "hand";
  model.num_layers = 1;
  model.params = {{"embed", {16, 8}, DType::bf16, ParamRole::embedding, -1},
                  {"q", {8, 8}, DType::bf16, ParamRole::attn_q, 0},
                  {"k", {8, 8}, DType::bf16, ParamRole::attn_k, 0},
                  {"v", {8, 8}, DType::bf16, ParamRole::attn_v, 0},
                  {"o", {8, 8}, DType::bf16, ParamRole::attn_o, 0},
                  {"up", {32, 8}, DType::bf16, ParamRole::mlp_up, 0},
                  {"down", {8, 32}, DType::bf16, ParamRole::mlp_down, 0},
                  {"norm", {8}, DType::bf16, ParamRole::norm, -1},
                  {"head", {16, 8}, DType::bf16, ParamRole::lm_head, -1}};
  int world = 1;
  for (const auto& d : dims) world *= d.size;
  return parallelize(model, DeviceMesh(dims, world), ParallelRules{});
}

}  // namespace muonbed::testing
