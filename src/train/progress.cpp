#include "train/progress.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>

#include <fmt/format.h>

#include "core/units.h"

namespace fp {

namespace {

std::string duration_format(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  const int64_t t = static_cast<int64_t>(std::llround(s));
  if (t < 60) return fmt::format("{}s", t);
  if (t < 3600) return fmt::format("{}m{:02}s", t / 60, t % 60);
  return fmt::format("{}h{:02}m", t / 3600, (t % 3600) / 60);
}

std::string rate_format(double tps) {
  return tps >= 1e4 ? fmt::format("{:.1f}K", tps / 1e3) : fmt::format("{:.0f}", tps);
}

}  // namespace

Progress::Progress(int64_t start, int64_t total, int64_t every, bool quiet)
    : start_(start), total_(total), every_(every < 1 ? 1 : every), quiet_(quiet),
      live_(!quiet && ::isatty(::fileno(stdout)) != 0) {}

Progress::~Progress() { clear_live(); }

void Progress::clear_live() {
  if (!drawn_) return;
  std::fputs("\r\033[K", stdout);
  std::fflush(stdout);
  drawn_ = false;
}

void Progress::step(const ProgressStep& s) {
  ++steps_;
  run_seconds_ += s.seconds;
  tokens_ += s.tokens_per_s * s.seconds;
  if (steps_ == 1) first_loss_ = best_loss_ = s.loss, best_step_ = s.step;
  if (s.loss < best_loss_) best_loss_ = s.loss, best_step_ = s.step;
  last_ = s;
  const bool evaluated = s.eval_loss >= 0;  // false for NaN too
  if (evaluated) eval_loss_ = s.eval_loss, eval_step_ = s.step;
  if (quiet_) return;
  if (live_) {
    draw_live();
    return;
  }
  if (s.step % every_ != 0 && s.step != total_ && s.step != start_ + 1 && !evaluated) return;
  fmt::print(
      "step {:>{}}/{} | loss {:.4f} | aux {:.4f} | grad norm {:.3f} | lr {:.2e} | {:.0f} tok/s | peak {} ({}){}{}\n",
      s.step, std::to_string(total_).size(), total_, s.loss, s.aux, s.grad_norm, s.lr, s.tokens_per_s,
      bytes_format(s.peak_bytes), s.binding,
      s.recall >= 0 ? fmt::format(" | recall acc {:.3f}", s.recall) : std::string(),
      evaluated ? fmt::format(" | eval loss {:.4f}", s.eval_loss) : std::string());
}

void Progress::draw_live() {
  const ProgressStep& s = last_;
  const double eta = run_seconds_ / static_cast<double>(steps_) * static_cast<double>(total_ - s.step);
  fmt::print("\r\033[Kstep {:>{}}/{} | loss {:.4f}{}{} | {} tok/s | peak {} ({}) | ETA {}", s.step,
             std::to_string(total_).size(), total_, s.loss,
             eval_loss_ >= 0 ? fmt::format(" | eval {:.4f} (step {})", eval_loss_, eval_step_) : std::string(),
             s.recall >= 0 ? fmt::format(" | recall acc {:.3f}", s.recall) : std::string(), rate_format(s.tokens_per_s),
             bytes_format(s.peak_bytes), s.binding, duration_format(eta));
  std::fflush(stdout);
  drawn_ = true;
}

void Progress::note(const std::string& text) {
  const bool redraw = drawn_;
  clear_live();
  fmt::print(stderr, "[flatpeak] {}\n", text);
  std::fflush(stderr);
  if (redraw) draw_live();  // the live line again, below the note
}

void Progress::finish(const std::string& outputs) {
  if (live_ && drawn_) {
    std::fputs("\n", stdout);
    drawn_ = false;
  }
  if (steps_ == 0) return;
  fmt::print(
      "done: {} step{} in {} ({} tok/s); loss {:.4f} -> {:.4f} (best {:.4f} at step {}){}{}; device peak {} "
      "({}); outputs in {}\n",
      steps_, steps_ == 1 ? "" : "s", duration_format(run_seconds_),
      rate_format(run_seconds_ > 0 ? tokens_ / run_seconds_ : 0), first_loss_, last_.loss, best_loss_, best_step_,
      eval_loss_ >= 0 ? fmt::format("; held-out loss {:.4f} (step {})", eval_loss_, eval_step_) : std::string(),
      last_.recall >= 0 ? fmt::format("; recall accuracy {:.3f}", last_.recall) : std::string(),
      bytes_format(last_.peak_bytes), last_.binding, outputs);
  std::fflush(stdout);
}

}  // namespace fp
