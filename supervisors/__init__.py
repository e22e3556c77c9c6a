"""supervisors: OTP's supervisor, Elixir's DynamicSupervisor and OTP applications on ``otp``.

The public API; everything lives in private modules and is re-exported here.
"""

from ._application import CONTROLLER_NAME as CONTROLLER_NAME
from ._application import Application as Application
from ._application import ApplicationError as ApplicationError
from ._application import ApplicationExit as ApplicationExit
from ._application import application_of as application_of
from ._application import application_supervisor as application_supervisor
from ._application import get_all_env as get_all_env
from ._application import get_env as get_env
from ._application import start_application as start_application
from ._application import stop_all_applications as stop_all_applications
from ._application import stop_application as stop_application
from ._application import wait_node_stop as wait_node_stop
from ._application import which_applications as which_applications
from ._child_api import count_children as count_children
from ._child_api import delete_child as delete_child
from ._child_api import get_childspec as get_childspec
from ._child_api import restart_child as restart_child
from ._child_api import start_child as start_child
from ._child_api import terminate_child as terminate_child
from ._child_api import which_children as which_children
from ._children import RESTARTING as RESTARTING
from ._observe import ApplicationView as ApplicationView
from ._observe import ChildView as ChildView
from ._observe import SupervisorView as SupervisorView
from ._plan import RestartPlan as RestartPlan
from ._plan import add_restart as add_restart
from ._plan import plan_one_for_all as plan_one_for_all
from ._plan import plan_one_for_one as plan_one_for_one
from ._plan import plan_rest_for_one as plan_rest_for_one
from ._plan import should_restart as should_restart
from ._spec import BRUTAL_KILL as BRUTAL_KILL
from ._spec import INFINITY as INFINITY
from ._spec import AutoShutdown as AutoShutdown
from ._spec import ChildSpec as ChildSpec
from ._spec import ChildSpecError as ChildSpecError
from ._spec import ChildType as ChildType
from ._spec import DynamicSupFlags as DynamicSupFlags
from ._spec import Restart as Restart
from ._spec import Strategy as Strategy
from ._spec import SupervisorError as SupervisorError
from ._spec import SupFlags as SupFlags
from ._spec import SupFlagsError as SupFlagsError
from ._spec import check_childspecs as check_childspecs
from ._supervisor import DynamicSupervisor as DynamicSupervisor
from ._supervisor import Supervisor as Supervisor
from ._tree import check_readiness as check_readiness
from ._tree import observe as observe
from ._tree import observe_supervisor as observe_supervisor

__all__ = [
    "BRUTAL_KILL",
    "CONTROLLER_NAME",
    "INFINITY",
    "RESTARTING",
    "Application",
    "ApplicationView",
    "ApplicationError",
    "ApplicationExit",
    "AutoShutdown",
    "ChildSpec",
    "ChildSpecError",
    "ChildType",
    "ChildView",
    "DynamicSupFlags",
    "DynamicSupervisor",
    "Restart",
    "RestartPlan",
    "Strategy",
    "SupFlags",
    "SupFlagsError",
    "Supervisor",
    "SupervisorError",
    "SupervisorView",
    "add_restart",
    "application_of",
    "application_supervisor",
    "check_childspecs",
    "check_readiness",
    "count_children",
    "delete_child",
    "get_all_env",
    "get_env",
    "get_childspec",
    "observe",
    "observe_supervisor",
    "plan_one_for_all",
    "plan_one_for_one",
    "plan_rest_for_one",
    "restart_child",
    "should_restart",
    "start_application",
    "start_child",
    "stop_all_applications",
    "stop_application",
    "terminate_child",
    "wait_node_stop",
    "which_applications",
    "which_children",
]


def _publish() -> None:
    # Public objects say they come from ``supervisors``, not from their private module.
    for name in __all__:
        obj = globals()[name]
        if isinstance(obj, type) or callable(obj):
            try:
                obj.__module__ = __name__
            except (AttributeError, TypeError):
                pass


_publish()
del _publish
