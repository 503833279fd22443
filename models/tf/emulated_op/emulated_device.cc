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
//
// Two kernels share that schedule. The CPU kernel copies the batch on the
// host. The GPU kernel never brings the batch to the host: on the op's GPU
// stream it copies the batch device to device (the one read, where the batch
// landed) and writes its output there, then queues a host callback on the
// stream; the step's device time starts when the stream reaches the
// callback, once the batch has really arrived and been read on the GPU. The
// callback only hands the deadline to the timer thread (no CUDA call may run
// inside it), which calls `done`. Only StreamExecutor's interface from
// TensorFlow's own headers is used, so it builds without the CUDA toolkit;
// under tensorflow-cpu the GPU registration is simply never used.

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <queue>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor_shape.h"
#include "xla/stream_executor/device_address.h"
#include "xla/stream_executor/stream.h"

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

// The device-time schedule of one op (one tower): when a step that arrives now finishes.
class Schedule {
 public:
  Schedule(float rate, float overlap) : rate_(rate), overlap_(overlap) {}

  Clock::time_point Deadline(Clock::time_point arrived, int64_t batch) {
    const auto period = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(batch / rate_));
    const auto hidden = std::chrono::duration_cast<Clock::duration>(period * overlap_);
    std::lock_guard<std::mutex> lock(mu_);
    Clock::time_point start;
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
    return busy_until_;
  }

 private:
  const float rate_;
  const float overlap_;
  std::mutex mu_;
  bool started_ = false;
  Clock::time_point busy_until_{};
  Clock::duration bank_{0};
};

// Finish a step at its deadline, from the timer thread; at once on this thread if the deadline has passed
// and `here` allows it. Inside a CUDA stream callback `here` is false: `done` hands the step back to
// TensorFlow's executor, which may launch work and call CUDA, and no CUDA call may run in a stream callback
// (CUDA runtime API, cudaLaunchHostFunc / cudaStreamAddCallback), so the timer thread runs it even then.
void FinishAt(Clock::time_point deadline, AsyncOpKernel::DoneCallback done, bool here = true) {
  if (here && Clock::now() >= deadline) {
    done();
    return;
  }
  Timer::Get().At(deadline, std::move(done));
}

class EmulatedDeviceStepBase : public AsyncOpKernel {
 public:
  explicit EmulatedDeviceStepBase(OpKernelConstruction* ctx) : AsyncOpKernel(ctx) {
    float rate = 0;
    float overlap = 0;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("rate", &rate));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("overlap", &overlap));
    OP_REQUIRES(ctx, rate > 0,
                absl::InvalidArgumentError(absl::StrCat("rate must be more than 0 images/s, got ", rate)));
    OP_REQUIRES(ctx, overlap >= 0 && overlap <= 1,
                absl::InvalidArgumentError(absl::StrCat("overlap must be within [0, 1], got ", overlap)));
    schedule_ = std::make_shared<Schedule>(rate, overlap);
  }

 protected:
  std::shared_ptr<Schedule> schedule_;
};

class EmulatedDeviceStepOp : public EmulatedDeviceStepBase {
 public:
  using EmulatedDeviceStepBase::EmulatedDeviceStepBase;

  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    const Clock::time_point arrived = Clock::now();
    const Tensor& images = ctx->input(0);
    OP_REQUIRES_ASYNC(ctx, images.dims() >= 1,
                      absl::InvalidArgumentError(absl::StrCat("images must have a batch dimension, got shape ",
                                                              images.shape().DebugString())),
                      done);
    const Clock::time_point deadline = schedule_->Deadline(arrived, images.dim_size(0));

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
    FinishAt(deadline, std::move(done));
  }

 private:
  std::mutex buffer_mu_;
  std::vector<char> buffer_;
};

// The GPU kernel: the batch stays on the GPU, and the step starts when the GPU stream reaches it.
class EmulatedDeviceStepGpuOp : public EmulatedDeviceStepBase {
 public:
  using EmulatedDeviceStepBase::EmulatedDeviceStepBase;

  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    const Tensor& images = ctx->input(0);
    OP_REQUIRES_ASYNC(ctx, images.dims() >= 1,
                      absl::InvalidArgumentError(absl::StrCat("images must have a batch dimension, got shape ",
                                                              images.shape().DebugString())),
                      done);
    tensorflow::DeviceContext* device_context = ctx->op_device_context();
    stream_executor::Stream* stream = device_context != nullptr ? device_context->stream() : nullptr;
    OP_REQUIRES_ASYNC(ctx, stream != nullptr, absl::InternalError("EmulatedDeviceStep on a GPU found no GPU stream"),
                      done);
    const int64_t batch = images.dim_size(0);
    const uint64_t nbytes = images.TotalBytes();

    // The one pass over the batch, on the device: a device-to-device copy into this step's buffer.
    Tensor copy;
    OP_REQUIRES_OK_ASYNC(
        ctx, ctx->allocate_temp(tensorflow::DT_UINT8, TensorShape({static_cast<int64_t>(nbytes)}), &copy), done);
    if (nbytes > 0) {
      stream_executor::DeviceAddressBase src(const_cast<char*>(images.tensor_data().data()), nbytes);
      stream_executor::DeviceAddressBase dst(const_cast<char*>(copy.tensor_data().data()), nbytes);
      OP_REQUIRES_OK_ASYNC(ctx, stream->MemcpyD2D(&dst, src, nbytes), done);
    }
    Tensor* out = nullptr;
    OP_REQUIRES_OK_ASYNC(ctx, ctx->allocate_output(0, TensorShape({}), &out), done);
    stream_executor::DeviceAddressBase work(out->data(), sizeof(float));
    const float one = 1.0f;
    uint32_t pattern = 0;
    std::memcpy(&pattern, &one, sizeof(pattern));
    OP_REQUIRES_OK_ASYNC(ctx, stream->Memset32(&work, pattern, sizeof(float)), done);

    // Queued behind the copy: when the stream gets here the batch is on the device and read, and the
    // step's device time may start. `copy` rides along so its memory outlives the stream's use of it.
    // A shared `done`: if queueing fails the callback never runs and the step is failed here.
    auto shared_done = std::make_shared<DoneCallback>(std::move(done));
    std::shared_ptr<Schedule> schedule = schedule_;
    const absl::Status queued = stream->DoHostCallback([schedule, batch, copy, shared_done]() {
      FinishAt(schedule->Deadline(Clock::now(), batch), std::move(*shared_done), /*here=*/false);
    });
    if (!queued.ok()) {
      ctx->SetStatus(absl::InternalError(
          absl::StrCat("EmulatedDeviceStep: queueing the step on the GPU stream failed: ", queued.ToString())));
      (*shared_done)();
    }
  }
};

REGISTER_KERNEL_BUILDER(Name("EmulatedDeviceStep").Device(tensorflow::DEVICE_CPU), EmulatedDeviceStepOp);
// The batch in device memory (no HostMemory input): it is read on the GPU, never copied to the host.
REGISTER_KERNEL_BUILDER(Name("EmulatedDeviceStep").Device(tensorflow::DEVICE_GPU), EmulatedDeviceStepGpuOp);

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
