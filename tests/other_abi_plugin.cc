// A plugin library built for a plugin interface version this worker does not have (version 1,
// before a Strategy's model became private): tests/plugins_e2e_test.cc checks that the worker
// refuses it at load, naming both versions, without entering it. It links nothing of dtrain's,
// as a stale library's entry points are all the worker can see of it.
extern "C" int dtrain_plugin_abi_version() { return 1; }

// Never called: a worker that entered a library of another version would stop here.
extern "C" void dtrain_register_plugins(void*) { __builtin_trap(); }
