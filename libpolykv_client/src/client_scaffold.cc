// TEMPORARY scaffold so the target has a source; deleted by the module's owner.
namespace polykv { [[maybe_unused]] static int scaffold_client_scaffold = 0; }
