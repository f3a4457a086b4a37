// RoPE frequencies with scaling (Note [RoPE scaling as transformers computes it]).
#include "model/rope_scaling.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "core/error.h"
#include "ops/rope.h"

namespace fp {

namespace {

double yarn_mscale(double scale, double mscale) { return scale <= 1 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0; }

}  // namespace

const char* rope_kind_name(RopeScaling::Kind k) {
  switch (k) {
    case RopeScaling::Kind::Kind_default: return "default";
    case RopeScaling::Kind::Kind_linear: return "linear";
    case RopeScaling::Kind::Kind_yarn: return "yarn";
    case RopeScaling::Kind::Kind_llama3: return "llama3";
    case RopeScaling::Kind::Kind_dynamic: return "dynamic";
  }
  return "?";
}

RopeTable rope_table(const ModelConfig& m, int64_t seq_len) {
  const int64_t hd = m.head_dim, half = hd / 2;
  const RopeScaling& r = m.rope_scaling;
  RopeTable t;
  t.inv_freq = ops::rope_default_inv_freq(m.rope_theta, hd);
  switch (r.kind) {
    case RopeScaling::Kind::Kind_default:
      break;
    case RopeScaling::Kind::Kind_linear:
      for (double& f : t.inv_freq) f /= r.factor;
      break;
    case RopeScaling::Kind::Kind_yarn: {
      const double original = static_cast<double>(r.original_max_position_embeddings);
      FP_ASSERT(original > 0, "yarn needs an original context length");
      if (r.attention_factor > 0)
        t.attention_factor = r.attention_factor;
      else if (r.mscale != 0 && r.mscale_all_dim != 0)
        t.attention_factor = yarn_mscale(r.factor, r.mscale) / yarn_mscale(r.factor, r.mscale_all_dim);
      else
        t.attention_factor = yarn_mscale(r.factor, 1.0);
      const double beta_fast = r.beta_fast != 0 ? r.beta_fast : 32, beta_slow = r.beta_slow != 0 ? r.beta_slow : 1;
      const double d = static_cast<double>(hd), base = m.rope_theta;
      // The dimension whose wavelength makes `rotations` turns over the original context.
      auto correction_dim = [&](double rotations) {
        return d * std::log(original / (rotations * 2 * std::numbers::pi)) / (2 * std::log(base));
      };
      double low = correction_dim(beta_fast), high = correction_dim(beta_slow);
      if (r.truncate) low = std::floor(low), high = std::ceil(high);
      low = std::max(low, 0.0);
      high = std::min(high, d - 1);
      if (low == high) high += 0.001;  // as transformers: no zero-width ramp
      for (int64_t i = 0; i < half; ++i) {
        const double ramp = std::clamp((static_cast<double>(i) - low) / (high - low), 0.0, 1.0);
        const double extrapolation = 1 - ramp;  // 1: keep inv_freq, 0: divide by factor
        const double f = t.inv_freq[i];
        t.inv_freq[i] = f / r.factor * (1 - extrapolation) + f * extrapolation;
      }
      break;
    }
    case RopeScaling::Kind::Kind_dynamic: {
      const double M = static_cast<double>(r.original_max_position_embeddings);
      FP_ASSERT(M > 0, "dynamic RoPE needs max_position_embeddings");
      const double L = std::max(static_cast<double>(seq_len), M), d = static_cast<double>(hd);
      const double base = m.rope_theta * std::pow(r.factor * L / M - (r.factor - 1), d / (d - 2));
      t.inv_freq = ops::rope_default_inv_freq(base, hd);
      break;
    }
    case RopeScaling::Kind::Kind_llama3: {
      const double original = static_cast<double>(r.original_max_position_embeddings);
      const double low_wavelen = original / r.low_freq_factor, high_wavelen = original / r.high_freq_factor;
      for (double& f : t.inv_freq) {
        const double wavelen = 2 * std::numbers::pi / f;
        if (wavelen > low_wavelen) {
          f /= r.factor;
        } else if (wavelen >= high_wavelen) {  // medium: a smooth blend
          const double smooth = (original / wavelen - r.low_freq_factor) / (r.high_freq_factor - r.low_freq_factor);
          f = (1 - smooth) * f / r.factor + smooth * f;
        }
      }
      break;
    }
  }
  return t;
}

}  // namespace fp
