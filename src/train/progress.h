// What a training run prints while it runs (`flatpeak train`, rank 0).
//
// On a terminal: one live line, redrawn in place every step (step/total, loss, recall accuracy,
// tokens/s, device peak and its category, ETA); anything else said meanwhile (a checkpoint) gets a
// line of its own above it. Not on a terminal (a file, a pipe, a CI log): a full line every
// `every` steps and at the last one. At the end, one summary: time, loss first -> last and the best,
// the final recall accuracy, the peak and where the outputs are.
#pragma once

#include <cstdint>
#include <string>

namespace fp {

struct ProgressStep {
  int64_t step = 0;
  double loss = 0, aux = 0, grad_norm = 0, lr = 0, tokens_per_s = 0, seconds = 0;
  double recall = -1;  // recall accuracy, < 0 when not measured
  uint64_t peak_bytes = 0;
  std::string binding;  // the category with the largest peak
  double eval_loss = -1;  // the held-out loss measured after this step, < 0 (or NaN) when not measured
};

class Progress {
 public:
  // every: a line per that many steps when not live; quiet: nothing but notes and the summary.
  Progress(int64_t start, int64_t total, int64_t every, bool quiet);
  ~Progress();
  void step(const ProgressStep& s);
  // A line of its own (stderr), keeping the live line below it.
  void note(const std::string& text);
  // Ends the live line and prints the summary (stdout).
  void finish(const std::string& outputs);
  bool live() const { return live_; }

 private:
  void clear_live();
  void draw_live();  // the live line of last_
  int64_t start_, total_, every_;
  bool quiet_, live_;
  bool drawn_ = false;
  double run_seconds_ = 0, tokens_ = 0;
  int64_t steps_ = 0;
  double first_loss_ = 0, best_loss_ = 0;
  int64_t best_step_ = 0;
  double eval_loss_ = -1;  // the latest held-out loss (< 0: none yet) and its step
  int64_t eval_step_ = 0;
  ProgressStep last_;
};

}  // namespace fp
