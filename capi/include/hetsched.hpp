// hetsched.hpp: a header-only C++17 wrapper of the C ABI (hetsched.h): RAII handles
// (each class owns one handle and destroys it once; movable, not copyable), strings
// copied into std::string and freed at once, every failing status thrown as
// hetsched::Error with the library's message, and the many-requests engine with
// std::function callbacks (hetsched::Requests) (docs/embedding.md).
#ifndef HETSCHED_HPP
#define HETSCHED_HPP

#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "hetsched.h"

namespace hetsched {

/// A failed call: its status and the calling thread's last error message.
class Error : public std::runtime_error {
  public:
    Error(hs_status status, const std::string &what)
        : std::runtime_error(what), status_(status) {}
    hs_status status() const noexcept { return status_; }

  private:
    hs_status status_;
};

/// Throws on a failing status.
inline void check(hs_status status, const char *call) {
    if (status != HS_OK) {
        const char *message = hs_last_error();
        throw Error(status, std::string(call) + ": " + hs_status_name(status) + ": " +
                                (message ? message : "(no message)"));
    }
}

/// A string the library handed out, copied and freed.
inline std::string take_string(char *text) {
    std::string copy = text ? text : "";
    hs_string_free(text);
    return copy;
}

namespace detail {
/// One owned handle of type T, destroyed with Destroy.
template <typename T, hs_status (*Destroy)(T *)> class Handle {
  public:
    Handle() = default;
    explicit Handle(T *raw) : raw_(raw) {}
    Handle(const Handle &) = delete;
    Handle &operator=(const Handle &) = delete;
    Handle(Handle &&other) noexcept : raw_(std::exchange(other.raw_, nullptr)) {}
    Handle &operator=(Handle &&other) noexcept {
        if (this != &other) {
            reset();
            raw_ = std::exchange(other.raw_, nullptr);
        }
        return *this;
    }
    ~Handle() { reset(); }
    T *get() const noexcept { return raw_; }

  private:
    void reset() noexcept {
        if (raw_) Destroy(raw_);
        raw_ = nullptr;
    }
    T *raw_ = nullptr;
};
} // namespace detail

/// A finished run: its makespan, JSON report and timelines.
class Run {
  public:
    explicit Run(hs_run *raw) : handle_(raw) {}
    hs_run *get() const noexcept { return handle_.get(); }
    std::uint64_t makespan_ns() const {
        std::uint64_t ns = 0;
        check(hs_run_makespan_ns(handle_.get(), &ns), "hs_run_makespan_ns");
        return ns;
    }
    std::string report_json() const {
        char *text = nullptr;
        check(hs_run_report_json(handle_.get(), &text), "hs_run_report_json");
        return take_string(text);
    }
    void write_chrome_trace(const std::string &path) const {
        check(hs_run_write_chrome_trace(handle_.get(), path.c_str()), "hs_run_write_chrome_trace");
    }
    void write_svg(const std::string &path) const {
        check(hs_run_write_svg(handle_.get(), path.c_str()), "hs_run_write_svg");
    }

  private:
    detail::Handle<hs_run, hs_run_destroy> handle_;
};

/// A prefill plan.
class Plan {
  public:
    explicit Plan(hs_plan *raw) : handle_(raw) {}
    hs_plan *get() const noexcept { return handle_.get(); }
    hs_plan_info info() const {
        hs_plan_info info{};
        check(hs_plan_get_info(handle_.get(), &info), "hs_plan_get_info");
        return info;
    }
    /// Simulates under `policy` (empty: the scene's own).
    Run simulate(const std::string &policy = "") const {
        hs_run *raw = nullptr;
        check(hs_simulate(handle_.get(), policy.empty() ? nullptr : policy.c_str(), &raw),
              "hs_simulate");
        return Run(raw);
    }

  private:
    detail::Handle<hs_plan, hs_plan_destroy> handle_;
};

/// A scene: device profile, model description, workload, policy.
class Scene {
  public:
    /// The shipped default scene.
    Scene() {
        hs_scene *raw = nullptr;
        check(hs_scene_default(&raw), "hs_scene_default");
        handle_ = detail::Handle<hs_scene, hs_scene_destroy>(raw);
    }
    /// A scene file, or a shipped scene by name.
    explicit Scene(const std::string &path) {
        hs_scene *raw = nullptr;
        check(hs_scene_load(path.c_str(), &raw), "hs_scene_load");
        handle_ = detail::Handle<hs_scene, hs_scene_destroy>(raw);
    }
    std::string name() const {
        char *text = nullptr;
        check(hs_scene_name(handle_.get(), &text), "hs_scene_name");
        return take_string(text);
    }
    void set_policy(const std::string &policy) {
        check(hs_scene_set_policy(handle_.get(), policy.c_str()), "hs_scene_set_policy");
    }
    void set_workload(std::uint32_t prompt_len, std::uint32_t chunk_len) {
        check(hs_scene_set_workload(handle_.get(), prompt_len, chunk_len), "hs_scene_set_workload");
    }
    void set_device_file(const std::string &path) {
        check(hs_scene_set_device_file(handle_.get(), path.c_str()), "hs_scene_set_device_file");
    }
    void set_model_file(const std::string &path) {
        check(hs_scene_set_model_file(handle_.get(), path.c_str()), "hs_scene_set_model_file");
    }
    Plan plan() const {
        hs_plan *raw = nullptr;
        check(hs_plan_create(handle_.get(), &raw), "hs_plan_create");
        return Plan(raw);
    }

  private:
    detail::Handle<hs_scene, hs_scene_destroy> handle_;
};

/// A run on the host's queues (see hs_engine_create). The queues' user data must
/// outlive the engine.
class Engine {
  public:
    Engine(const Plan &plan, std::uint32_t clock, const std::string &policy = "") {
        hs_engine *raw = nullptr;
        check(hs_engine_create(plan.get(), policy.empty() ? nullptr : policy.c_str(), clock, &raw),
              "hs_engine_create");
        handle_ = detail::Handle<hs_engine, hs_engine_destroy>(raw);
    }
    hs_engine *get() const noexcept { return handle_.get(); }
    void set_queue(std::uint32_t processor, const hs_queue &queue) {
        check(hs_engine_set_queue(handle_.get(), processor, &queue), "hs_engine_set_queue");
    }
    void run() { check(hs_engine_run(handle_.get()), "hs_engine_run"); }
    /// One non-blocking step; true once the run finished.
    bool step() {
        std::int32_t finished = 0;
        check(hs_engine_step(handle_.get(), &finished), "hs_engine_step");
        return finished != 0;
    }
    /// Callable from any thread.
    void complete(std::uint32_t job, std::uint64_t start_ns, std::uint64_t end_ns) const {
        check(hs_engine_complete(handle_.get(), job, start_ns, end_ns), "hs_engine_complete");
    }
    /// Callable from any thread: the run stops at the next subgraph boundary and run()
    /// or step() throws an Error whose status() is HS_ERR_CANCELLED.
    void cancel() const { check(hs_engine_cancel(handle_.get()), "hs_engine_cancel"); }
    Run result() const {
        hs_run *raw = nullptr;
        check(hs_engine_result(handle_.get(), &raw), "hs_engine_result");
        return Run(raw);
    }

  private:
    detail::Handle<hs_engine, hs_engine_destroy> handle_;
};

/// Runs measured on the host's queues (HS_CLOCK_WALL) gathered into a device profile
/// (hs_profile_*; docs/embedding.md, "Profiling a device through the host's queues").
class Profile {
  public:
    Profile() {
        hs_profile *raw = nullptr;
        check(hs_profile_create(&raw), "hs_profile_create");
        handle_ = detail::Handle<hs_profile, hs_profile_destroy>(raw);
    }
    /// Adds a measured run (copied: `run` stays the caller's).
    void add_run(const Run &run) {
        check(hs_profile_add_run(handle_.get(), run.get()), "hs_profile_add_run");
    }
    /// Fits and writes device.toml, model.toml and scene.toml into the folder `dir`
    /// (empty `name`: the runs' device's name); returns the summary JSON.
    std::string write(const std::string &dir, const std::string &name = "") const {
        char *summary = nullptr;
        check(hs_profile_write(handle_.get(), dir.c_str(), name.empty() ? nullptr : name.c_str(),
                               &summary),
              "hs_profile_write");
        return take_string(summary);
    }

  private:
    detail::Handle<hs_profile, hs_profile_destroy> handle_;
};

/// How one request is generated (`hs_request_options` without its callbacks). The
/// defaults: 128 tokens, greedy, interactive, one sample, no stop strings.
struct RequestOptions {
    std::uint32_t max_tokens = 128;
    /// 0: greedy.
    float temperature = 0.0f;
    /// 0 keeps every token.
    std::uint32_t top_k = 0;
    /// 1 keeps every token.
    float top_p = 1.0f;
    std::uint64_t seed = 0;
    std::uint8_t priority = HS_PRIORITY_INTERACTIVE;
    /// Samples of the prompt, 1 to HS_MAX_SAMPLES; sample i seeds with seed + i.
    std::uint32_t n = 1;
    /// Each sample ends before the first of these (at most HS_MAX_STOP_STRINGS, each 1
    /// to HS_MAX_STOP_BYTES bytes); a stop string never reaches the token callback.
    std::vector<std::string> stop;
};

/// How a request ended: its status (`HS_OK`, `HS_ERR_CANCELLED` or
/// `HS_ERR_RUN_FAILED`) and the library's result JSON (finish reason and metrics, or
/// the error).
struct RequestEnd {
    hs_status status = HS_OK;
    std::string result_json;
};

/// A request's whole text, one string per sample, and its end (Requests::generate).
struct Generated {
    std::vector<std::string> samples;
    RequestEnd end;
    /// Sample 0's text.
    const std::string &text() const { return samples.at(0); }
};

/// Many generation requests on one model (hs_requests_*): open loads the model and
/// starts the engine; the destructor cancels what is still live, waits for every
/// request's last callback and joins the library's threads.
///
/// Callbacks run on the library's event thread, one call at a time, never two at once.
/// They may call submit, cancel and metrics_json, but must not destroy this object
/// (hs_requests_close from a callback is refused and the engine would stay open).
/// An exception thrown by a callback never crosses into the library: it is caught,
/// the request is cancelled, and its end reports HS_ERR_CANCELLED.
class Requests {
  public:
    /// Each piece of a sample's generated text (valid for the call only).
    using TokenFn =
        std::function<void(std::uint64_t request, std::uint32_t sample, std::string_view text)>;
    /// The request's last callback.
    using FinishFn = std::function<void(std::uint64_t request, const RequestEnd &end)>;

    /// Loads the GGUF model at `model_path` within `limits` (every field 0: the
    /// defaults).
    explicit Requests(const std::string &model_path, const hs_requests_limits &limits = {}) {
        hs_requests *raw = nullptr;
        check(hs_requests_open(model_path.c_str(), &limits, &raw), "hs_requests_open");
        handle_ = detail::Handle<hs_requests, hs_requests_close>(raw);
    }

    /// Submits `prompt`; returns its id at once (the callbacks may start before).
    std::uint64_t submit(const std::string &prompt, const RequestOptions &options,
                         TokenFn on_token = {}, FinishFn on_finish = {}) {
        // Owned by the library's callbacks from here until on_finish, which frees it.
        auto state = std::make_unique<Callbacks>(
            Callbacks{handle_.get(), std::move(on_token), std::move(on_finish)});
        hs_request_options raw{};
        raw.max_tokens = options.max_tokens;
        raw.temperature = options.temperature;
        raw.top_k = options.top_k;
        raw.top_p = options.top_p;
        raw.seed = options.seed;
        raw.priority = options.priority;
        raw.n = options.n;
        // Read during the submit only: pointers into `options.stop` suffice.
        std::vector<const char *> stop;
        stop.reserve(options.stop.size());
        for (const std::string &s : options.stop) stop.push_back(s.c_str());
        raw.stop = stop.data();
        raw.stop_count = stop.size();
        raw.on_token = &Requests::token_trampoline;
        raw.on_finish = &Requests::finish_trampoline;
        raw.user_data = state.get();
        std::uint64_t id = 0;
        // On an error nothing of the request ran and no callback will come: the
        // unique_ptr still owns the state and frees it as the exception leaves.
        check(hs_requests_submit(handle_.get(), prompt.c_str(), &raw, &id),
              "hs_requests_submit");
        state.release();
        return id;
    }

    /// Submits `prompt` and blocks until it ended: its text and end. Not from a
    /// callback (it would wait on the thread that delivers its own callbacks).
    Generated generate(const std::string &prompt, const RequestOptions &options) {
        // Grown as text comes: `options.n` is only trusted once the library accepted it.
        auto samples = std::make_shared<std::vector<std::string>>();
        auto ended = std::make_shared<std::promise<RequestEnd>>();
        std::future<RequestEnd> end = ended->get_future();
        submit(
            prompt, options,
            [samples](std::uint64_t, std::uint32_t sample, std::string_view piece) {
                if (sample >= samples->size()) samples->resize(sample + 1);
                (*samples)[sample].append(piece);
            },
            [ended](std::uint64_t, const RequestEnd &e) { ended->set_value(e); });
        Generated result;
        result.end = end.get();
        // The last callback happened before set_value: no callback touches samples now.
        result.samples = std::move(*samples);
        // A sample that ended before any text (its first token the end of sequence).
        result.samples.resize(options.n > 1 ? options.n : 1);
        return result;
    }

    /// Cancels a live request (its end comes with HS_ERR_CANCELLED); from any thread.
    void cancel(std::uint64_t request) const {
        check(hs_requests_cancel(handle_.get(), request), "hs_requests_cancel");
    }

    /// The engine's counters as JSON.
    std::string metrics_json() const {
        char *text = nullptr;
        check(hs_requests_metrics_json(handle_.get(), &text), "hs_requests_metrics_json");
        return take_string(text);
    }

  private:
    struct Callbacks {
        hs_requests *engine;
        TokenFn on_token;
        FinishFn on_finish;
    };

    static void token_trampoline(void *user_data, std::uint64_t request, std::uint32_t sample,
                                 const char *text, std::size_t len) {
        auto *callbacks = static_cast<Callbacks *>(user_data);
        if (!callbacks->on_token) return;
        try {
            callbacks->on_token(request, sample, std::string_view(text, len));
        } catch (...) {
            // No exception may unwind through the library: end the request instead, and
            // give the callback no more text (pieces already on their way still come).
            callbacks->on_token = nullptr;
            hs_requests_cancel(callbacks->engine, request);
        }
    }

    static void finish_trampoline(void *user_data, std::uint64_t request, hs_status status,
                                  const char *result_json) {
        // The request's last callback: the state is freed here.
        std::unique_ptr<Callbacks> callbacks(static_cast<Callbacks *>(user_data));
        if (!callbacks->on_finish) return;
        try {
            callbacks->on_finish(request, RequestEnd{status, result_json ? result_json : ""});
        } catch (...) {
            // Nothing left to cancel; the exception must not reach the library.
        }
    }

    detail::Handle<hs_requests, hs_requests_close> handle_;
};

} // namespace hetsched

#endif // HETSCHED_HPP
