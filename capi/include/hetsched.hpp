// hetsched.hpp: a header-only C++17 wrapper of the C ABI (hetsched.h): RAII handles
// (each class owns one handle and destroys it once; movable, not copyable), strings
// copied into std::string and freed at once, and every failing status thrown as
// hetsched::Error with the library's message (docs/embedding.md).
#ifndef HETSCHED_HPP
#define HETSCHED_HPP

#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>

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

} // namespace hetsched

#endif // HETSCHED_HPP
