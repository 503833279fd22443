// EmulatedDeviceStep: one training step of an emulated accelerator.
//
// The kernel reads its batch once (a copy into a buffer it owns, as the copy
// to a real device would read it) and then finishes batch / rate seconds
// after the step's device time began, without using host CPU and without
// holding a thread: it is an async kernel whose `done` callback a single
// timer thread calls at the deadline.
//
// Device time per tower follows an absolute schedule, so host overheads
// between steps do not accumulate: a step's device time starts when its
// batch arrives or when the previous step's device time ends, whichever is
// later, except that host work between two steps is hidden from a bank that
// each step refills by `overlap` of a period (capped at one period), as a
// GPU's queue hides the host launching the next step. Idle time beyond the
// bank (waiting for input) is never made up for.

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <mutex>
#include <queue>
#include <thread>
#include <vector>

#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor_shape.h"

#ifndef EMULATED_DEVICE_BUILD_STAMP
#define EMULATED_DEVICE_BUILD_STAMP "unknown"
#endif
extern "C" __attribute__((used, visibility("default"))) const char feedbench_emulated_device_build_stamp[] =
    "feedbench-emulated-device-stamp:" EMULATED_DEVICE_BUILD_STAMP;

namespace feedbench {
namespace {

using Clock = std::chrono::steady_clock;
using tensorflow::AsyncOpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Tensor;
using tensorflow::TensorShape;
namespace errors = tensorflow::errors;

// One thread for every emulated device in the process: it sleeps until the
// earliest deadline and then runs that step's `done`. Callbacks are cheap
// (they hand the step back to TensorFlow's executor).
class Timer {
 public:
  static Timer& Get() {
    static Timer* timer = new Timer();  // never destroyed: may be used until the process exits
    return *timer;
  }

  void At(Clock::time_point when, std::function<void()> fn) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push(Entry{when, seq_++, std::move(fn)});
    }
    cv_.notify_one();
  }

 private:
  struct Entry {
    Clock::time_point when;
    uint64_t seq;
    std::function<void()> fn;
    bool operator>(const Entry& o) const { return when != o.when ? when > o.when : seq > o.seq; }
  };

  Timer() {
    std::thread([this] { Loop(); }).detach();
  }

  void Loop() {
#ifdef __linux__
    pthread_setname_np(pthread_self(), "emulated_dev");
#endif
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      if (queue_.empty()) {
        cv_.wait(lock);
        continue;
      }
      Clock::time_point when = queue_.top().when;
      if (Clock::now() < when) {
        cv_.wait_until(lock, when);
        continue;  // woken early (a new, earlier deadline) or on time: look again
      }
      std::function<void()> fn = std::move(const_cast<Entry&>(queue_.top()).fn);
      queue_.pop();
      lock.unlock();
      fn();
      lock.lock();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> queue_;
  uint64_t seq_ = 0;
};

class EmulatedDeviceStepOp : public AsyncOpKernel {
 public:
  explicit EmulatedDeviceStepOp(OpKernelConstruction* ctx) : AsyncOpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("rate", &rate_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("overlap", &overlap_));
    OP_REQUIRES(ctx, rate_ > 0, errors::InvalidArgument("rate must be more than 0 images/s, got ", rate_));
    OP_REQUIRES(ctx, overlap_ >= 0 && overlap_ <= 1,
                errors::InvalidArgument("overlap must be within [0, 1], got ", overlap_));
  }

  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    const Clock::time_point arrived = Clock::now();
    const Tensor& images = ctx->input(0);
    OP_REQUIRES_ASYNC(ctx, images.dims() >= 1,
                      errors::InvalidArgument("images must have a batch dimension, got shape ",
                                              images.shape().DebugString()),
                      done);
    const int64_t batch = images.dim_size(0);
    const auto period = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(batch / rate_));
    const auto hidden = std::chrono::duration_cast<Clock::duration>(period * overlap_);

    Clock::time_point start;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!started_) {
        start = arrived;
        started_ = true;
      } else if (arrived <= busy_until_) {
        start = busy_until_;
      } else {
        // The device sat idle since busy_until_: host work between steps, or waiting for input.
        // A bank of hidden time, refilled by `overlap` of a period per step and capped at one
        // period, lets the device hide that much; anything longer is idle time for good.
        bank_ = std::min(bank_ + hidden, period);
        const Clock::duration credit = std::min(arrived - busy_until_, bank_);
        bank_ -= credit;
        start = arrived - credit;
      }
      busy_until_ = start + period;
    }
    const Clock::time_point deadline = start + period;

    // The one pass over the batch: copy it where the device would hold it.
    const auto bytes = images.tensor_data();
    uint64_t check = 0;
    {
      std::lock_guard<std::mutex> lock(buffer_mu_);
      if (buffer_.size() < bytes.size()) buffer_.resize(bytes.size());
      std::memcpy(buffer_.data(), bytes.data(), bytes.size());
      if (!bytes.empty()) check = static_cast<unsigned char>(buffer_[bytes.size() - 1]);
    }
    Tensor* out = nullptr;
    OP_REQUIRES_OK_ASYNC(ctx, ctx->allocate_output(0, TensorShape({}), &out), done);
    // 1.0 plus a vanishing trace of the batch: the loss depends on the data, the step on this op.
    out->scalar<float>()() = 1.0f + static_cast<float>(check) * 1e-12f;

    if (Clock::now() >= deadline) {
      done();
      return;
    }
    Timer::Get().At(deadline, std::move(done));
  }

 private:
  float rate_ = 0;
  float overlap_ = 0;
  std::mutex mu_;
  bool started_ = false;
  Clock::time_point busy_until_{};
  Clock::duration bank_{0};
  std::mutex buffer_mu_;
  std::vector<char> buffer_;
};

REGISTER_KERNEL_BUILDER(Name("EmulatedDeviceStep").Device(tensorflow::DEVICE_CPU), EmulatedDeviceStepOp);

}  // namespace
}  // namespace feedbench

REGISTER_OP("EmulatedDeviceStep")
    .Input("images: T")
    .Output("work: float")
    .Attr("T: type")
    .Attr("rate: float")
    .Attr("overlap: float = 0.0")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::ScalarShape)
    .Doc(R"doc(
One step of an emulated accelerator that trains at `rate` images/s: reads the
batch once, then completes batch / rate seconds after its device time began
(an absolute schedule per op, without host CPU). `overlap` is the share of a
step's period of host work between steps that the device hides.
)doc");
